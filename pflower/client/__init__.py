"""The Flower ClientApp ([`pflower.client.app`][pflower.client.app]). The client half every
algorithm derives from
is [`pflower.core.client.PersonalClient`][pflower.core.client.PersonalClient]."""
