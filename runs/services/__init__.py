"""Write-side business logic of the runs app (HackSoftware style: services write, selectors read)."""
