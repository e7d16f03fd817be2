"""The namespace lab lives in the product (appliance/lab/netns.py, ``rackboot lab``);
the tests and benchmarks import it from here as they always did."""

from appliance.lab.netns import (  # noqa: F401
    IFNAMSIZ,
    Host,
    Lab,
    LabError,
    have_commands,
    need_root,
    netns_exists,
    probe_netns,
)
