"""The floor a no-op converge is measured against: a pyinfra deploy that reads one fact per host."""

from pyinfra import host
from pyinfra.facts.server import Hostname

host.get_fact(Hostname)
