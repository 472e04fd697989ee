"""Differential privacy shared by the protocol families: noise calibration as the papers do it
(`calibration`), tight calibration and the privacy ledger by Google's dp-accounting
(`accounting`), the PM-I/PM-II p-sum releases and the Sch-Var-1 variance releases (`release`),
and the bit arithmetic of PM-II's binary tree (`bits`)."""
