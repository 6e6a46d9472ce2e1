"""Flow control: priorities, fairness between flows, shedding by predicted TTFT.

Layout: `config` (the --flow-config file: capacity, classes, flows, keys; metric labels),
`bands` (tickets, and per priority band the flows' fair queues), `gate` (the admission
rules: at once, queued or refused; the router's deployment-wide gate and a preprocessor's
own while no router answers).
"""
