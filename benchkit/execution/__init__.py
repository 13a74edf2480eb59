"""Execution: runs executed end to end (runner), their outcome (the record every path stores),
and offline execution into bundles (offline, bundle). Takes RunSpecs; reads no sweep file."""
