"""The privacy canaries: one known secret per masking rule kind, each unique enough that a
byte-level scan for it can't hit anything else. Imported by the canary program (which feeds
them in through every surface) and by the test (which scans every byte the project wrote)."""
from __future__ import annotations

EMAIL = "canary.alice@example.org"
EMAIL_ESCAPED_SOURCE = "canary.bob@corp.example"  # sent JSON-escaped as canary.bob\u0040corp.example
# A private key whose body holds escaped slashes (\/), sent only JSON-escaped.
ESCAPED_KEY_PART = "canaryEscapedKey"
OPENAI_KEY = "sk-proj-CanaryQ7v2XbLk9TnWp4ZrYd8HsMf3GjUe6Ac"
ANTHROPIC_KEY = "sk-ant-api03-CanaryR5tYu8IoP2aSdF4gHjK6lZxC9vBnM1qW3eRt"
AWS_KEY = "AKIACANARY7Q2W3E4R5T"
GITHUB_TOKEN = "ghp_Canary1a2b3c4d5e6f7g8h9i0jKLMNOPQRSTu"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjYW5hcnktdXNlci00MiJ9."
       "Q2FuYXJ5U2lnbmF0dXJlVmFsdWVGb3JUZXN0czQy")
BEARER = "Bearer CanaryBearerTokenZ8x7c6v5b4n3m2"
CARD = "4539 1488 0343 6467"  # Luhn-valid test number
IBAN = "DE89370400440532013000"  # the standard valid example IBAN
SSN = "078-05-1120"  # masked by a json_path rule of the test's retrace.toml ($..ssn)
PRIVATE_KEY = ("-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEAcanaryKeyBody0123\n"
               "-----END PRIVATE KEY-----")
FORK_EMAIL = "canary.forked@example.net"  # only in the fork's edit file
ENV_SECRET = "ghp_CanaryEnvValue9z8y7x6w5v4u3t2s1r0qPON"  # an env value the program reads

# What the scan looks for: a distinctive part of each canary (the whole value, and for values
# that could be stored escaped or split, the parts that survive any of that).
NEEDLES = [
    "canary.alice", "example.org", "canary.bob", "canaryEscapedKey", "CanaryQ7v2XbLk9TnWp4ZrYd8HsMf3GjUe6Ac",
    "CanaryR5tYu8IoP2aSdF4gHjK6lZxC9vBnM1qW3eRt", "AKIACANARY7Q2W3E4R5T", "Canary1a2b3c4d5e6f7g8h9i0jKLMNOPQRSTu",
    "eyJzdWIiOiJjYW5hcnktdXNlci00MiJ9", "Q2FuYXJ5U2lnbmF0dXJlVmFsdWVGb3JUZXN0czQy", "CanaryBearerTokenZ8x7c6v5b4n3m2",
    "4539 1488 0343 6467", "4539148803436467", "DE89370400440532013000", "078-05-1120", "canaryKeyBody0123",
    "canary.forked", "CanaryEnvValue9z8y7x6w5v4u3t2s1r0qPON",
]
