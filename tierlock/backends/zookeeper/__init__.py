"""The ZooKeeper engine (kazoo): ``zookeeper://host:port[,host:port...][/chroot]``."""

from .backend import ZooKeeperBackend

__all__ = ["ZooKeeperBackend"]
