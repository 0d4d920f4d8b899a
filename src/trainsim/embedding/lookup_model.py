"""What a model of EmbeddingBag time answers (Lin et al. Sec. III-E): the seconds of a sharded piece's lookup
(forward) or its backward with the sparse update. The models themselves (roofline, the learned MLP, their in-situ
scaling) are priced in cost.embedding_lookup; the front-ends that read traces take any of them by this protocol."""

from typing import Literal, Protocol

from trainsim.embedding.sharding import ShardPiece

LookupPhase = Literal["fwd", "bwd"]


class LookupCostModel(Protocol):
    @property
    def name(self) -> str: ...

    def lookup_s(self, piece: ShardPiece, phase: LookupPhase) -> float: ...
