"""The Flower ServerApp ([`pflower.server.app`][pflower.server.app]). The server half every
algorithm derives from
is [`pflower.core.strategy.PersonalizedStrategy`][pflower.core.strategy.PersonalizedStrategy]."""
