// Package simulate is a deterministic multi-region simulator: it runs the real
// decision engine (pop.Engine over the embedded store.Memory), its CRDT deltas
// and joins, on a virtual clock and a simulated network, and measures how far
// each limiting strategy lets traffic exceed the limit against an exact oracle.
//
// A run is one goroutine and reads no wall clock: an event queue orders
// arrivals, flush timers, snapshots and message deliveries by virtual time,
// ties broken by insertion sequence, and all randomness comes from PCG streams
// seeded by the scenario's seed. The same scenario and seed give a
// byte-identical report.
//
// What a run models. Each strategy (Edgelimit, AsyncSync, LocalOnly,
// StaticSplit, Centralized) gets fresh engines and stores and the very same
// arrivals: the traffic draws from its own PCG stream of the seed, the
// network from another. The arrivals are drawn once, in chunks that every
// strategy's run reads (traffic); the runs go concurrently, one goroutine
// each, and share nothing else but the read-only scenario. A run more than
// a few chunks ahead of the slowest waits for it, so memory stays bounded.
//
// Sources are Poisson streams, each on a limit key (sources sharing a key
// share its limit), with start/end and on/off phases; a Mix generates
// hundreds of thousands of them, each with its own key. Sources that send
// all run long are merged into one Poisson stream of their summed rate whose
// arrivals pick a source by rate (an alias table): the same process, with one
// event in the queue instead of one per source. Edgelimit's and AsyncSync's
// PoPs each run the replication protocol itself, replication/core, the very
// core the JetStream Replicator drives: one tick event per PoP at its core's
// NextDeadline, and every message the core publishes (delta batches,
// snapshots, mitigation bits, presence beacons) carried by the simulated
// network and handed to the receiving PoP's core with Step; what the core
// asks to apply goes to the PoP's store and bit table, and a changed share
// of global limits to its engine. The store's and bit table's own news
// (BitsIssued, Urgent) reach the core after each decision. Each copy of a
// message reaches every other PoP after the one-way latency between their
// regions plus uniform jitter, unless lost (Loss) or duplicated (Duplicate).
// A partition holds deltas, snapshots and bits that cross the cut until it
// heals, as JetStream stream sourcing does; presence beacons go like core
// NATS messages, lost, not held, on a cut link. Messages and bytes count
// every copy handed to the network, sized as the proto message that carries
// it. PoPs drop ended mitigation bits every second, and may run on a skewed
// clock (ClockSkew). The run records how long each mitigation bit took from
// the hit that issued it to every other PoP, and, after a partition heals,
// // records how long until every PoP holds every other PoP's counts as they
// were at the heal.
//
// The oracle is an exact sliding-window log, per key, over the hits every PoP admitted.
// Even Centralized, which sees every hit at once, is graded against it: its
// residual overshoot and wrong decisions are those of the sliding-window
// counter itself (prev × (1 − elapsed/window) + cur), the baseline the other
// strategies add their own error to.
//
// simulate imports pop, pop/store, pop/rules, crdt and proto; production code
// never imports simulate.
package simulate
