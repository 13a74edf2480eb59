"""HTTP API of the runs app: `POST /api/ingest/` stores an offline bundle (runs.services.ingest).

Request: the bundle folder as a tar.gz body (`tar czf - -C bundle manifest.json runs`, or
benchkit.execution.bundle.tar_bundle), `Content-Type: application/gzip`, and the host's token
(created in the admin, Host tokens) as `Authorization: Bearer <token>`. Answers JSON
(runs.services.ingest.IngestReport.to_dict: counts and one entry per run file):

- 200: every run stored or ingested before (a second send of a bundle is a no-op that says so);
- 422: some run files refused (each with `file: reason`, nothing stored for them), the others stored;
- 400: the archive or its manifest cannot be read (nothing stored);
- 401: no token; 403: unknown or revoked token, or a bundle of another host (nothing stored);
- 411: no Content-Length (a chunked upload, `Transfer-Encoding: chunked`): not accepted, since
  the WSGI server hands Django no body without one; send the length (curl --data-binary does);
- 413: body larger than settings.DRAFTBOARD_INGEST_MAX_BYTES, or a bundle that decompresses to
  more than benchkit.execution.bundle.MAX_BUNDLE_BYTES (1 GiB; one of its files to more than
  MAX_FILE_BYTES, 256 MiB), counted as it is decompressed, reading stopped there (nothing stored).
"""

from __future__ import annotations

import tempfile

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from benchkit.execution.bundle import BundleError, BundleTooLarge, open_bundle_tar
from runs.services.ingest import IngestRefused, authenticate, ingest_bundle

_CHUNK = 1024 * 1024


def _bearer(request) -> str:
    scheme, _, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@csrf_exempt  # a machine client authenticated by its token, never a browser session
@require_POST
def ingest(request):
    """Store the bundle in the request body; see the module docstring for the answers."""
    token = _bearer(request)
    if not token:
        return JsonResponse({"error": "send the host's token as 'Authorization: Bearer <token>'"}, status=401)
    try:
        host_token = authenticate(token)
    except IngestRefused as exc:
        return JsonResponse({"error": str(exc)}, status=403)
    if not request.META.get("CONTENT_LENGTH"):
        return JsonResponse({"error": "chunked uploads (no Content-Length header) are not accepted: send the "
                                      "bundle with a Content-Length header (curl --data-binary @bundle.tar.gz "
                                      "sends one); nothing stored"}, status=411)
    limit = settings.DRAFTBOARD_INGEST_MAX_BYTES
    with tempfile.SpooledTemporaryFile(max_size=16 * _CHUNK) as body:
        size = 0
        while chunk := request.read(_CHUNK):  # the stream, not request.body (DATA_UPLOAD_MAX_MEMORY_SIZE)
            size += len(chunk)
            if size > limit:
                return JsonResponse({"error": f"bundle larger than {limit} bytes"}, status=413)
            body.write(chunk)
        body.seek(0)
        try:
            bundle = open_bundle_tar(body)
            report = ingest_bundle(bundle, token=host_token)
        except BundleTooLarge as exc:
            return JsonResponse({"error": f"{exc} (nothing stored)", "limit_bytes": exc.limit}, status=413)
        except BundleError as exc:
            return JsonResponse({"error": f"{exc} (nothing stored)"}, status=400)
        except IngestRefused as exc:
            return JsonResponse({"error": f"{exc} (nothing stored)"}, status=403)
    return JsonResponse(report.to_dict(), status=422 if report.of("refused") else 200)
