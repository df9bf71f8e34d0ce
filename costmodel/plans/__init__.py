"""One attention layer planned on one machine: the inputs (declared once), their binding to the
formulas, the time model, the scheme comparison, the verdict, and the report's schema."""
