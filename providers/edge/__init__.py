"""The provider layer's Django edge: profiles, the curated matrix, the SecretStore, the
key ring and the settings pages."""
