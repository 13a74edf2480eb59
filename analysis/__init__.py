"""The analysis app: speedup matching, figure builders, dashboard views and exports."""
