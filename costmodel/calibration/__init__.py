"""Turning kernel measurements into a measured profile (:mod:`.fit`) and comparing predictions with
measurements (:mod:`.compare`). No torch here: the kernel measures, this package fits and compares."""
