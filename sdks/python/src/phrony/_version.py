"""The SDK's release version."""

SDK_VERSION = "0.2.0"
