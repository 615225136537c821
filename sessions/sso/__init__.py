"""Sign-in through the team's OpenID Connect identity provider (issue 22)."""
