"""Reports: HTML pages for runs, sweeps, plans and accuracy, and trace exports."""
