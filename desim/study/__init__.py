"""The study layer: study files (`spec`), scenarios (`scenario`), results folders and runs
(`results`; runs of one trajectory simulated once: `sharing`), summaries (`summary`), figures
(`plots`) and the command line (`cli`)."""
