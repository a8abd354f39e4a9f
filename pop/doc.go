// Package pop is a point of presence: the decision engine that answers rate
// limit checks from the rule set and a counter store, and the PoP's metrics.
// Its sub-packages name its roles: limit (the algorithms, pure), rules (the
// rule files), store (the embedded and Redis counter stores), httpapi (the
// HTTP check API) and loadgen (the load generator that sizes a PoP); client
// is the Go client applications use, poptest runs real PoP processes for tests.
//
// Concurrency limits (Stripe's concurrent-requests limiter) are decided beside
// the rate limits: CheckLeaseAt takes a slot of each in a Leaser (the
// embedded store.Leases or Redis) before the rate limits count, hands out a
// lease token, and gives the slots back when the request is denied; Release
// frees them, and a lease's TTL frees them when no release comes.
//
// The engine takes the time as an argument (CheckAt) so that the simulator can
// run it on a virtual clock; Check reads the wall clock. pop imports crdt and
// region, never replication or simulate: a PoP hands its deltas out and takes
// remote ones in through small interfaces that cmd wires up.
package pop
