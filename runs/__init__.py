"""The runs app: hosts, hardware snapshots, sweeps, runs, metrics, and the services that execute them."""
