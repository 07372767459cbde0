"""Several hypervisor hosts on one store (docs/hosts.md): this host's heartbeat and the view of the
fleet (:mod:`.registry`), where a new instance goes (:mod:`.placement`), what is served where
(:mod:`.router`), forwarding to a peer controller (:mod:`.forward`) and how it vouches for the
caller (:mod:`.peerauth`)."""
