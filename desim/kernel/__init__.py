"""The simulation kernel: what every run needs, whatever it simulates.

SimPy drives time (`engine`); agents' messages travel through the `network` in batches
(`messages`), over a `links.LinkModel`, possibly to a parameter `server`; protocols implement
`protocol.Protocol` and find their way in through the `registry`, filled by plug-in packages
(`plugins`); every random draw comes from a named stream (`randomness`); the `recorder` measures
what protocols expose at checkpoints; `params` validates every parameter with one-line errors;
`rowindex` finds the rows of ids seen so far (state kept only for what a run meets).
The kernel never imports a protocol family, a network model or the study layer.
"""
