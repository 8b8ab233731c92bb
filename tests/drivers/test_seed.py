"""The NoCloud seed (gpucap.drivers.seed): the files cloud-init reads, parsed back as cloud-init
would, and the ISO image read back with pycdlib; a tenant's bad user-data is refused with a
message that names it."""

import email
import io
import json
import subprocess

import pycdlib
import pytest
import yaml

from gpucap.drivers.seed import (
    USER_DATA_LIMIT,
    GuestNetwork,
    Seed,
    SeedError,
    seed_files,
    seed_iso,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISeedSeedSeedSeed nina@laptop"
NETWORK = GuestNetwork(
    mac="52:54:00:AB:CD:12",
    address="10.200.0.18/24",
    gateway="10.200.0.1",
    nameservers=("1.1.1.1",),
)


def seed(**changes) -> Seed:
    return Seed(
        **{
            "instance_id": "vm-42",
            "hostname": "train-1",
            "ssh_public_key": KEY,
            "network": NETWORK,
            **changes,
        }
    )


def test_meta_data_names_the_instance_and_its_hostname_as_strings():
    files = seed_files(seed(hostname="no"))  # YAML 1.1 would read a bare no as false
    assert yaml.safe_load(files["meta-data"]) == {"instance-id": "vm-42", "local-hostname": "no"}


def test_user_data_without_the_tenants_own_is_a_cloud_config_with_the_key():
    text = seed_files(seed())["user-data"].decode()
    assert text.startswith("#cloud-config\n")
    assert yaml.safe_load(text) == {"ssh_authorized_keys": [KEY]}


def test_the_tenants_user_data_follows_the_key_in_a_multipart_cloud_init_merges():
    script = "#!/bin/sh\necho hello > /etc/motd\n"
    message = email.message_from_bytes(seed_files(seed(user_data=script))["user-data"])
    parts = [part for part in message.walk() if not part.is_multipart()]
    assert message.get_content_type() == "multipart/mixed"
    assert [part.get_content_type() for part in parts] == [
        "text/cloud-config",
        "text/x-shellscript",
    ]
    assert yaml.safe_load(parts[0].get_payload(decode=True)) == {"ssh_authorized_keys": [KEY]}
    assert parts[1].get_payload(decode=True).decode() == script


def test_network_config_gives_the_address_gpucap_assigned_on_the_vms_mac():
    config = yaml.safe_load(seed_files(seed())["network-config"])
    assert config == {
        "version": 2,
        "ethernets": {
            "eth0": {
                "match": {"macaddress": "52:54:00:ab:cd:12"},
                "set-name": "eth0",
                "addresses": ["10.200.0.18/24"],
                "gateway4": "10.200.0.1",
                "nameservers": {"addresses": ["1.1.1.1"]},
            }
        },
    }
    assert "network-config" not in seed_files(seed(network=None))


def test_the_iso_is_labelled_cidata_and_carries_the_three_files():
    files = seed_files(seed(user_data="#cloud-config\npackages: [htop]\n"))
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(seed_iso(seed(user_data="#cloud-config\npackages: [htop]\n"))))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        assert iso.joliet_vd.volume_identifier.decode("utf-16-be").strip() == "cidata"
        for name, content in files.items():
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, joliet_path=f"/{name}")
            assert out.getvalue() == content, name
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            assert out.getvalue() == content, name
    finally:
        iso.close()


@pytest.mark.parametrize(
    ("user_data", "reason"),
    [
        ("x" * (USER_DATA_LIMIT + 1), "user_data: is 16,385 bytes; at most 16,384 are allowed"),
        ("#!/bin/sh\necho \x00\n", "user_data: must be text without NUL characters"),
        ("#cloud-config\n- just\n- a list\n", "user_data: is #cloud-config but not a YAML mapping"),
        ("#cloud-config\nkey: [unclosed\n", "user_data: is #cloud-config but not valid YAML"),
    ],
    ids=["too-large", "nul", "not-a-mapping", "bad-yaml"],
)
def test_bad_user_data_is_refused_naming_the_field_and_why(user_data, reason):
    with pytest.raises(SeedError) as refused:
        seed_iso(seed(user_data=user_data))
    assert str(refused.value).startswith(reason)


def test_user_data_at_the_limit_is_taken():
    files = seed_files(seed(user_data="#!/bin/sh\n" + "#" * (USER_DATA_LIMIT - 10)))
    assert len(files["user-data"]) > USER_DATA_LIMIT
    assert json.loads(files["meta-data"])["instance-id"] == "vm-42"


def test_blkid_finds_the_label_cloud_init_looks_for(tmp_path):
    """cloud-init's NoCloud finds its seed by filesystem label, as blkid reports it."""
    image = tmp_path / "seed.iso"
    image.write_bytes(seed_iso(seed()))
    probe = subprocess.run(
        ["blkid", "-o", "export", str(image)], capture_output=True, text=True, check=True
    )
    found = dict(line.split("=", 1) for line in probe.stdout.split())
    assert (found["TYPE"], found["LABEL"]) == ("iso9660", "cidata")
