"""Tests of fedrift compare and the report (tables, figures, report.html)."""
