"""Measurements, never judged in tests: ``runner`` (`kvspec bench`: the efficiency table, lookup probes, the transfer
bench on real rank processes, the lookup deadline), ``load`` (the live load harness: rank processes under concurrent
requests on a real master), and the GPU machine's scripts (``gpu_carry.sh``, ``gpu_check.sh``)."""
