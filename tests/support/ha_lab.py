"""The namespace rack lives in the product (appliance/lab/rack.py, ``rackboot lab``);
the HA tests and benchmarks import it from here as they always did."""

from appliance.lab.rack import APPLIANCES, PORT, HaNode, Rack  # noqa: F401
