"""Azure URIs and credentials: parsing `az://`, `abfs[s]://`, `wasb[s]://` URIs, and the credentials that travel
to executors without ever printing (pipelines.io.azure_storage uses them for blob I/O).

Credentials come only from the environment (`AzureCredentials.from_env()`) or a Databricks secret scope
(`AzureCredentials.from_databricks_secrets(dbutils, scope, ...)`), never from job arguments or config files. They
pickle (executors receive them inside the task closure), but `repr`/`str` show the kind and account only, and
`scrub` replaces every secret (and its URL-encoded forms) in a message by `***`. SAS signatures in the HTTP
libraries' own log lines are redacted too (`redact_sas_in_http_logs`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from urllib.parse import quote, quote_plus, unquote

from pipelines.errors import UsageError
from pipelines.io.uris import AZURE_SCHEMES

ENV_CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ENV_ACCOUNT_NAME = "AZURE_STORAGE_ACCOUNT_NAME"
ENV_ACCOUNT_KEY = "AZURE_STORAGE_ACCOUNT_KEY"
ENV_SAS_TOKEN = "AZURE_STORAGE_SAS_TOKEN"
ENV_BLOB_ENDPOINT = "AZURE_STORAGE_BLOB_ENDPOINT"  # optional, not a secret: emulators, private endpoints
ENV_CLIENT_ID = "AZURE_CLIENT_ID"
ENV_CLIENT_SECRET = "AZURE_CLIENT_SECRET"
ENV_TENANT_ID = "AZURE_TENANT_ID"

_MASK = "***"
_MIN_SECRET_LENGTH = 6  # shorter values are not scrubbed: replacing e.g. "sv" everywhere would mangle messages


# ---- URIs -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlobPath:
    """A parsed Azure URI. `path` is the blob name or prefix inside `container` (no leading slash)."""

    scheme: str
    container: str
    path: str
    account: str | None = None  # from the URI's host, None for az:// and adlfs-style abfs://container/...
    host: str | None = None  # e.g. "acct.dfs.core.windows.net"

    def uri_for(self, blob_name: str) -> str:
        """The URI of blob `blob_name` (a full name in this container), spelled like this one."""
        authority = f"{self.container}@{self.host}" if self.host else self.container
        return f"{self.scheme}://{authority}" + (f"/{blob_name}" if blob_name else "")

    @property
    def uri(self) -> str:
        return self.uri_for(self.path)


def parse_blob_uri(uri: str) -> BlobPath:
    """Split an Azure URI into container, path and (when the URI names it) account. The path is the blob name
    verbatim, as listings spell it: '#', '?', '%' and spaces are part of the name, not URL syntax."""
    scheme, _, rest = uri.partition("://")
    scheme = scheme.lower()
    if scheme not in AZURE_SCHEMES:
        raise UsageError(
            f"{uri!r} is not an Azure URI; use az://container/path or "
            f"abfss://container@account.dfs.core.windows.net/path"
        )
    netloc, _, path = rest.partition("/")
    if re.search(r"[?&]sig=", rest):
        raise UsageError(
            f"{uri!r}: looks like a SAS token in the URI; put SAS tokens in {ENV_SAS_TOKEN}, "
            "not in the URI (it would be written into every output row)"
        )
    container, at, host = netloc.partition("@")
    if not container:
        raise UsageError(
            f"{uri!r} names no container; use {scheme}://<container>/<path>"
            + (" or <container>@<account>.dfs.core.windows.net" if scheme != "az" else "")
        )
    if at and not host:
        raise UsageError(f"{uri!r}: nothing after '@'; use {scheme}://<container>@<account>.dfs.core.windows.net/...")
    if scheme == "az" and at:
        raise UsageError(f"{uri!r}: az:// takes no account; use az://<container>/<path> or abfss://...@account...")
    account = host.split(".", 1)[0] if host else None
    return BlobPath(scheme, container, path.lstrip("/"), account, host or None)


# ---- credentials ------------------------------------------------------------------------------------------------


def _parse_connection_string(connection_string: str) -> dict[str, str]:
    fields = {}
    for item in connection_string.split(";"):
        key, eq, value = item.partition("=")
        if eq:
            fields[key.strip()] = value.strip()
    return fields


def account_name_from_env() -> str | None:
    """The storage account named by the environment (not a secret), or None."""
    name = os.environ.get(ENV_ACCOUNT_NAME, "").strip()
    if name:
        return name
    return _parse_connection_string(os.environ.get(ENV_CONNECTION_STRING, "")).get("AccountName") or None


@dataclass(frozen=True, repr=False)
class AzureCredentials:
    """One way to authenticate to Azure Storage. Build with from_env() or from_databricks_secrets().

    Exactly one of: a connection string; account name + key; account name + SAS token; a service principal
    (client id, secret, tenant; the account then comes from the URI or account_name). Picklable; never printed.
    """

    account_name: str | None = None
    connection_string: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    tenant_id: str | None = None
    blob_endpoint: str | None = None
    _secrets: tuple[str, ...] = field(default=(), init=False, compare=False)

    def __post_init__(self):
        for name in (
            "account_name",
            "connection_string",
            "account_key",
            "sas_token",
            "client_id",
            "client_secret",
            "tenant_id",
            "blob_endpoint",
        ):
            value = getattr(self, name)
            object.__setattr__(self, name, value.strip() if isinstance(value, str) and value.strip() else None)
        if self.sas_token:
            object.__setattr__(self, "sas_token", self.sas_token.lstrip("?"))
        if self.connection_string:
            fields = _parse_connection_string(self.connection_string)
            if not fields:
                raise UsageError(
                    f"the Azure connection string is malformed (expected 'Key=Value;...'); check "
                    f"{ENV_CONNECTION_STRING} or the secret it came from"
                )
            if not self.account_name and fields.get("AccountName"):
                object.__setattr__(self, "account_name", fields["AccountName"])
        elif self.account_key or self.sas_token:
            if not self.account_name:
                raise UsageError(f"an account key or SAS token needs the account name: set {ENV_ACCOUNT_NAME}")
        elif self.client_id or self.client_secret or self.tenant_id:
            missing = [
                env
                for env, value in (
                    (ENV_CLIENT_ID, self.client_id),
                    (ENV_CLIENT_SECRET, self.client_secret),
                    (ENV_TENANT_ID, self.tenant_id),
                )
                if not value
            ]
            if missing:
                raise UsageError(f"service principal credentials are incomplete: {', '.join(missing)} missing")
        else:
            raise UsageError(self._missing_message())
        object.__setattr__(self, "_secrets", self._secret_variants())

    @staticmethod
    def _missing_message() -> str:
        return (
            f"no Azure Storage credentials: set {ENV_CONNECTION_STRING}, or {ENV_ACCOUNT_NAME} with "
            f"{ENV_ACCOUNT_KEY} or {ENV_SAS_TOKEN}, or {ENV_CLIENT_ID}/{ENV_CLIENT_SECRET}/{ENV_TENANT_ID} "
            f"(service principal); on Databricks use AzureCredentials.from_databricks_secrets(dbutils, scope, ...)"
        )

    @classmethod
    def from_env(cls) -> AzureCredentials:
        """Credentials from the process environment; the first complete set wins, in the order of the class doc."""
        env = os.environ
        get = lambda name: env.get(name, "").strip() or None  # noqa: E731
        common = dict(account_name=get(ENV_ACCOUNT_NAME), blob_endpoint=get(ENV_BLOB_ENDPOINT))
        if get(ENV_CONNECTION_STRING):
            return cls(connection_string=get(ENV_CONNECTION_STRING), **common)
        if get(ENV_ACCOUNT_KEY):
            return cls(account_key=get(ENV_ACCOUNT_KEY), **common)
        if get(ENV_SAS_TOKEN):
            return cls(sas_token=get(ENV_SAS_TOKEN), **common)
        if get(ENV_CLIENT_ID) or get(ENV_CLIENT_SECRET) or get(ENV_TENANT_ID):
            return cls(
                client_id=get(ENV_CLIENT_ID),
                client_secret=get(ENV_CLIENT_SECRET),
                tenant_id=get(ENV_TENANT_ID),
                **common,
            )
        raise UsageError(cls._missing_message())

    @classmethod
    def from_databricks_secrets(
        cls,
        dbutils,
        scope: str,
        *,
        connection_string_key: str | None = None,
        account_key_key: str | None = None,
        sas_token_key: str | None = None,
        client_id_key: str | None = None,
        client_secret_key: str | None = None,
        tenant_id_key: str | None = None,
        account_name_key: str | None = None,
        account_name: str | None = None,
    ) -> AzureCredentials:
        """Credentials from a Databricks secret scope: each `*_key` is the NAME of a secret in `scope`.

        `account_name` (not a secret) may be given directly; otherwise it comes from `account_name_key`, the
        connection string or the URI.
        """
        keys = dict(
            connection_string=connection_string_key,
            account_key=account_key_key,
            sas_token=sas_token_key,
            client_id=client_id_key,
            client_secret=client_secret_key,
            tenant_id=tenant_id_key,
            account_name=account_name_key,
        )
        if not any(value for name, value in keys.items() if name != "account_name"):
            raise UsageError(
                "from_databricks_secrets: name at least one secret, e.g. connection_string_key=... or "
                "account_key_key=... (the key names inside the scope, not the secrets)"
            )
        values = {}
        for name, key in keys.items():
            if key:
                try:
                    values[name] = dbutils.secrets.get(scope=scope, key=key)
                except Exception as exc:  # the Databricks error names scope and key, never the value
                    raise UsageError(
                        f"cannot read secret {key!r} from Databricks scope {scope!r} "
                        f"({type(exc).__name__}); check `dbutils.secrets.list({scope!r})`"
                    ) from None
        if account_name and not values.get("account_name"):
            values["account_name"] = account_name
        return cls(**values)

    @property
    def kind(self) -> str:
        """'connection_string', 'account_key', 'sas' or 'service_principal'."""
        if self.connection_string:
            return "connection_string"
        if self.account_key:
            return "account_key"
        if self.sas_token:
            return "sas"
        return "service_principal"

    def scrub(self, text: str) -> str:
        """`text` with every secret (and its URL-encoded forms) replaced by ***."""
        for secret in self._secrets:
            text = text.replace(secret, _MASK)
        return text

    def _secret_variants(self) -> tuple[str, ...]:
        secrets = {self.connection_string, self.account_key, self.sas_token, self.client_secret}
        if self.connection_string:
            fields = _parse_connection_string(self.connection_string)
            secrets.update((fields.get("AccountKey"), fields.get("SharedAccessSignature")))
        for token in [
            self.sas_token,
            self.connection_string and _parse_connection_string(self.connection_string).get("SharedAccessSignature"),
        ]:
            for item in (token or "").split("&"):
                key, _, value = item.partition("=")
                if key == "sig":
                    secrets.add(value)
        variants: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= _MIN_SECRET_LENGTH:
                variants.update((secret, unquote(secret), quote(secret, safe=""), quote_plus(secret), quote(secret)))
        return tuple(sorted(variants, key=len, reverse=True))

    def __repr__(self) -> str:
        return f"AzureCredentials(kind={self.kind!r}, account={self.account_name!r}, secrets={_MASK})"

    __str__ = __repr__


# ---- logs -------------------------------------------------------------------------------------------------------

_SAS_SIGNATURE = re.compile(r"([?&]sig=)[^&\s\"']+", re.IGNORECASE)
# The Azure SDK's own HTTP logging redacts query strings, but urllib3 logs every request line (with a SAS `sig=`)
# at DEBUG. These loggers get a filter that redacts SAS signatures before any handler sees the record.
_HTTP_LOGGERS = ("urllib3.connectionpool",)


class RedactSasSignature(logging.Filter):
    """Replaces the value of `sig=` in log records by REDACTED."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "sig=" in message.lower():
            record.msg, record.args = _SAS_SIGNATURE.sub(r"\1REDACTED", message), None
        return True


def redact_sas_in_http_logs() -> None:
    """Install RedactSasSignature on the HTTP loggers once per process (idempotent)."""
    for name in _HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, RedactSasSignature) for existing in logger.filters):
            logger.addFilter(RedactSasSignature())
