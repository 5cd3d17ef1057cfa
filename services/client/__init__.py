"""The application's client for the mesh."""

from services.client.batch import Batch
from services.client.client import DsClient
from services.client.errors import ClientError
from services.records.batches import DsRecord

__all__ = ["Batch", "ClientError", "DsClient", "DsRecord"]
