"""Session-scoped Azurite (Azure Blob emulator) for the Azure tests.

Azurite 3.35.0 lives in `<repo>/.tools/azurite` (scripts/install_azurite.sh, run here when missing). Only the blob
service runs, on a free 127.0.0.1 port with a temp data dir. No environment is set: a test that wants the
environment credentials path does `monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)`.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.tools.connect_server import answers, free_port

__all__ = ["Azurite", "azurite"]

REPO = Path(__file__).resolve().parents[1]
AZURITE_DIR = REPO / ".tools" / "azurite"
AZURITE_BIN = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
INSTALL_SCRIPT = REPO / "scripts" / "install_azurite.sh"
START_TIMEOUT_S = 60.0

# The emulator's documented development account (public, the same in every Azurite).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass(frozen=True)
class Azurite:
    """A running Azurite blob service."""

    blob_port: int
    data_dir: Path
    log_path: Path
    account_name: str = ACCOUNT_NAME
    account_key: str = ACCOUNT_KEY

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.blob_port}/{self.account_name}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account_name};AccountKey={self.account_key};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    def service_client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_container(self, name: str | None = None) -> str:
        """Create a container (a fresh unique name by default) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        with self.service_client() as service:
            service.create_container(name)
        return name


def _ensure_installed() -> Path:
    if not AZURITE_BIN.exists():
        subprocess.run(["bash", str(INSTALL_SCRIPT)], check=True, timeout=600)
    if not AZURITE_BIN.exists():
        raise RuntimeError(f"{INSTALL_SCRIPT} ran but {AZURITE_BIN} is missing; run it by hand to see why")
    return AZURITE_BIN


@pytest.fixture(scope="session")
def azurite(tmp_path_factory) -> Azurite:
    binary = _ensure_installed()
    base = tmp_path_factory.mktemp("azurite")
    data_dir, log_path = base / "data", base / "azurite.log"
    data_dir.mkdir()
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "--silent",
                "--disableTelemetry",
                "--loose",
                "--skipApiVersionCheck",
                "--location",
                str(data_dir),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                state = f"exited with code {process.returncode}" if process.poll() is not None else "timed out"
                raise RuntimeError(
                    f"Azurite {state} before port {port} answered; log {log_path}:\n"
                    f"{log_path.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        yield Azurite(blob_port=port, data_dir=data_dir, log_path=log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
