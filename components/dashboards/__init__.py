"""Grafana dashboards as small pure functions returning the dashboard JSON model."""
