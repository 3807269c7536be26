"""A pod's volumes and API credentials as local directories (the kubelet's volume manager).

Each volume becomes ``<pod dir>/volumes/<name>``: ``configMap`` and ``secret`` volumes hold one
file per key (or per ``items`` entry), ``projected`` volumes merge their ConfigMap, Secret,
downward-API and service-account-token sources, ``downwardAPI`` volumes hold the requested
fields, and every other kind (``emptyDir``, ``hostPath``, claims) is an empty directory. A
container's mounts map each ``mountPath`` to that directory (or to one file for ``subPath``).

Files are written atomically (temporary file + rename), and ``refresh()`` rewrites the ones whose
ConfigMap or Secret changed, so a process that watches its config file sees edits, as with a
real kubelet.

Pods with a service account get a bound token from the TokenRequest API, the cluster CA and
their namespace under ``serviceaccount/`` (mounted at the standard in-cluster path), plus a
kubeconfig using that token, named by ``KUBECONFIG`` in the container's environment.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kvgate.podrunner.spec import field_value

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 24 * 3600


def write_atomic(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` unless it already holds it; True when the file changed."""
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


class PodVolumes:
    """Materialises one pod's volumes under ``pod_dir`` and keeps them current."""

    def __init__(
        self,
        core: client.CoreV1Api,
        pod: Mapping[str, Any],
        pod_dir: Path,
        *,
        api_server: str,
        ca_cert: bytes,
    ) -> None:
        self._core = core
        self._pod = pod
        self._dir = pod_dir
        self._api_server = api_server
        self._ca_cert = ca_cert
        self._namespace = str(pod["metadata"]["namespace"])
        self.kubeconfig: Path | None = None

    def volume_dir(self, name: str) -> Path:
        return self._dir / "volumes" / name

    async def write_all(self) -> bool:
        """Write every volume (and credentials); True if any file changed."""
        changed = False
        for volume in self._pod["spec"].get("volumes") or []:
            changed |= await self._write_volume(volume)
        if self._wants_service_account():
            await self._write_service_account()
        return changed

    async def refresh(self) -> bool:
        """Rewrite ConfigMap/Secret-backed files whose source changed; True if any did."""
        changed = False
        for volume in self._pod["spec"].get("volumes") or []:
            if {"configMap", "secret", "projected"} & volume.keys():
                changed |= await self._write_volume(volume)
        return changed

    def mounts(self, container: Mapping[str, Any]) -> dict[str, Path]:
        """mountPath -> local path, for one container."""
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            local = self.volume_dir(mount["name"])
            if mount.get("subPath"):
                local = local / mount["subPath"]
            mounts[str(mount["mountPath"])] = local
        if self._wants_service_account() and SERVICE_ACCOUNT_PATH not in mounts:
            mounts[SERVICE_ACCOUNT_PATH] = self._dir / "serviceaccount"
        return mounts

    async def source_values(self, kind: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's data as text (None when it does not exist)."""
        raw = await self._source_bytes(kind, name)
        if raw is None:
            return None
        return {key: value.decode(errors="replace") for key, value in raw.items()}

    async def _source_bytes(self, kind: str, name: str) -> dict[str, bytes] | None:
        try:
            if kind == "configmap":
                cm = await self._core.read_namespaced_config_map(name, self._namespace)
                data = {k: v.encode() for k, v in (cm.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
                return data
            secret = await self._core.read_namespaced_secret(name, self._namespace)
            return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _write_volume(self, volume: Mapping[str, Any]) -> bool:
        target = self.volume_dir(str(volume["name"]))
        target.mkdir(parents=True, exist_ok=True)
        changed = False
        if "configMap" in volume:
            changed |= await self._write_source(target, "configmap", volume["configMap"])
        elif "secret" in volume:
            source = dict(volume["secret"])
            source["name"] = source.get("secretName", "")
            changed |= await self._write_source(target, "secret", source)
        elif "downwardAPI" in volume:
            changed |= self._write_downward(target, volume["downwardAPI"].get("items") or [])
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                if "configMap" in source:
                    changed |= await self._write_source(target, "configmap", source["configMap"])
                elif "secret" in source:
                    changed |= await self._write_source(target, "secret", source["secret"])
                elif "downwardAPI" in source:
                    changed |= self._write_downward(
                        target, source["downwardAPI"].get("items") or []
                    )
                elif (
                    "serviceAccountToken" in source
                    and not (target / source["serviceAccountToken"]["path"]).exists()
                ):
                    token = await self._request_token()
                    changed |= write_atomic(
                        target / source["serviceAccountToken"]["path"], token.encode()
                    )
        return changed

    async def _write_source(self, target: Path, kind: str, source: Mapping[str, Any]) -> bool:
        data = await self._source_bytes(kind, str(source.get("name", "")))
        if data is None:
            if not source.get("optional", False):
                log.warning("%s %s/%s not found (yet)", kind, self._namespace, source.get("name"))
            return False
        items = source.get("items")
        files = (
            {str(item["path"]): data[item["key"]] for item in items if item["key"] in data}
            if items
            else data
        )
        changed = False
        for path, content in files.items():
            changed |= write_atomic(target / path, content)
        return changed

    def _write_downward(self, target: Path, items: list[Mapping[str, Any]]) -> bool:
        changed = False
        for item in items:
            path = str(item.get("fieldRef", {}).get("fieldPath", ""))
            if path in ("metadata.labels", "metadata.annotations"):
                values = self._pod["metadata"].get(path.split(".")[1]) or {}
                text = "".join(f'{k}="{v}"\n' for k, v in sorted(values.items()))
            else:
                text = field_value(self._pod, path)
            changed |= write_atomic(target / str(item["path"]), text.encode())
        return changed

    def _wants_service_account(self) -> bool:
        spec = self._pod["spec"]
        return spec.get("automountServiceAccountToken", True) is not False

    async def _request_token(self) -> str:
        meta = self._pod["metadata"]
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=TOKEN_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=meta["name"], uid=meta["uid"]
                ),
            )
        )
        account = self._pod["spec"].get("serviceAccountName") or "default"
        result = await self._core.create_namespaced_service_account_token(
            account, self._namespace, body
        )
        return str(result.status.token)

    async def _write_service_account(self) -> None:
        directory = self._dir / "serviceaccount"
        token = await self._request_token()
        write_atomic(directory / "token", token.encode())
        write_atomic(directory / "ca.crt", self._ca_cert)
        write_atomic(directory / "namespace", self._namespace.encode())
        ca = base64.b64encode(self._ca_cert).decode()
        kubeconfig = (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: cluster\n  cluster:\n    server: {self._api_server}\n"
            f"    certificate-authority-data: {ca}\n"
            f"users:\n- name: pod\n  user:\n    token: {token}\n"
            f"contexts:\n- name: pod\n  context: {{cluster: cluster, user: pod, namespace: {self._namespace}}}\n"
            "current-context: pod\n"
        )
        self.kubeconfig = directory / "kubeconfig"
        write_atomic(self.kubeconfig, kubeconfig.encode())
