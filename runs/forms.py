"""Admin forms."""

from __future__ import annotations

from django import forms

from benchkit.sweeps import sweepfile as sweepspec
from runs.models import Host


class InvalidateForm(forms.Form):
    """Asks the reason for invalidating the selected runs."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), max_length=2000,
                             help_text="Why these runs must not count (kept with the run for audit).")


class SweepYamlForm(forms.Form):
    """A sweep entered in the admin as the same YAML a sweeps/*.yaml file holds."""

    host = forms.ModelMultipleChoiceField(
        queryset=Host.objects.all(), required=False,
        help_text="One or more hosts: each runs the whole grid on its own queue. Leave empty when the YAML names "
                  "its `hosts:` (they win).")
    grid = forms.CharField(widget=forms.Textarea(attrs={"rows": 24, "cols": 100, "class": "vLargeTextField"}),
                           help_text="Sweep YAML, as in sweeps/*.yaml.")
    enqueue = forms.BooleanField(required=False, initial=True, help_text="Queue the runs on the host's worker now.")

    def clean_grid(self):
        """Parse and validate the YAML; the error names the field that is wrong."""
        try:
            spec = sweepspec.loads_sweep(self.cleaned_data["grid"], source="admin YAML")
            spec.require_resolved()
        except sweepspec.SweepError as exc:
            raise forms.ValidationError(str(exc)) from None
        return spec

    def clean(self):
        """A host is needed unless the YAML names its `hosts:`."""
        data = super().clean()
        spec = data.get("grid")
        if spec is not None and not spec.hosts and not data.get("host"):
            self.add_error("host", "choose at least one host (or name `hosts:` in the YAML)")
        return data


class AcknowledgeForm(forms.Form):
    """Asks why the selected regression flags are acknowledged (kept with the flag for audit)."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), max_length=5000,
                             help_text="Why this is expected or handled (e.g. 'driver 580 is slower on TP8; "
                                       "filed upstream'). Kept with the flag for audit.")
