"""The gateway over TLS: HTTPS and gRPC with --tls-cert/--tls-key on real servers (throwaway
certificates); plaintext callers and callers that do not trust the certificate are refused."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from analysim._protos.v1 import prediction_pb2 as ppb
from analysim._protos.v1 import prediction_pb2_grpc as ppb_grpc
from analysim.tls import TlsFiles, secure_channel
from mlaas_monitor.server import GatewayThread
from mlaas_monitor.service import Gateway, Limits
from mlaas_monitor.store import Store
from tests.polling import scaled
from tests.test_gateway_helpers import ADMIN_KEY, credit_model
from tests.tlscerts import CA


def test_gateway_serves_https_and_grpc_tls_only(tmp_path: Path, store_db: str) -> None:
    ca, stranger = CA(tmp_path, "ca"), CA(tmp_path, "stranger")
    cert = ca.issue("gateway")
    store = Store(store_db, background_checkpoint=True)
    store.add_model(credit_model())
    try:
        with GatewayThread(Gateway(store, ADMIN_KEY, Limits()), tls=TlsFiles(cert=cert.cert, key=cert.key)) as gw:
            assert gw.url.startswith("https://")
            trusted = ssl.create_default_context(cafile=ca.files.cert)
            headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
            with urllib.request.urlopen(urllib.request.Request(gw.url + "/v1/models", headers=headers),
                                        context=trusted, timeout=scaled(10)) as r:
                assert r.status == 200 and "credit" in json.dumps(json.loads(r.read()))
            with pytest.raises(urllib.error.URLError):  # the certificate is not one it trusts
                urllib.request.urlopen(gw.url + "/v1/models", timeout=10,
                                       context=ssl.create_default_context(cafile=stranger.files.cert))
            with pytest.raises((urllib.error.URLError, ConnectionError)):  # plaintext HTTP to the TLS port
                urllib.request.urlopen(gw.url.replace("https://", "http://") + "/v1/models", timeout=scaled(10))

            def list_models(files: TlsFiles) -> grpc.StatusCode:
                with secure_channel(gw.grpc_target, files) as ch:
                    try:
                        ppb_grpc.PredictionServiceStub(ch).ListModels(ppb.ListModelsRequest(), timeout=5,
                                                                      metadata=(("authorization", f"Bearer {ADMIN_KEY}"),))
                    except grpc.RpcError as e:
                        return e.code()
                return grpc.StatusCode.OK

            assert list_models(TlsFiles(ca=ca.files.cert)) == grpc.StatusCode.OK
            assert list_models(TlsFiles()) == grpc.StatusCode.UNAVAILABLE
            assert list_models(TlsFiles(ca=stranger.files.cert)) == grpc.StatusCode.UNAVAILABLE
    finally:
        store.close()
