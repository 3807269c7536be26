"""The pod runner: runs the pods of KWOK's fake nodes as local processes (a process kubelet).

Used by the local cluster in hack/cluster (tests/e2e and the playground) only; nothing else in
kvgate imports it. ``kvgate podrunner`` starts it (see command.py); spec.py is the pure mapping
from a container to a process, volumes.py the pod's files, process.py one supervised process,
pod.py one pod, runner.py the watch loop.
"""
