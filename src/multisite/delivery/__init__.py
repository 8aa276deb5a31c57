"""Guaranteed message delivery (SQL Remote's model): publications, subscribers, messages framed by log
offsets, confirmations, store-and-forward transports, both ways. See ``DESIGN.md``."""

from .server.agent import Agent, PollReport
from .server.api import extract, publish, remote_setup, status, subscribe
from .machine import Receiver, ReceiveState, Sender, SendState
from .message import Message, Tx

__all__ = ["Agent", "Message", "PollReport", "ReceiveState", "Receiver", "SendState", "Sender", "Tx", "extract",
           "publish", "remote_setup", "status", "subscribe"]
