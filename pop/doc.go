// Package pop is a point of presence: the decision engine that answers rate
// limit checks from the rule set and a counter store, and the PoP's metrics.
// Its sub-packages name its roles: limit (the algorithms, pure), rules (the
// rule files), store (the embedded and Redis counter stores), httpapi (the
// HTTP check API) and loadgen (the load generator that sizes a PoP).
//
// The engine takes the time as an argument (CheckAt) so that the simulator can
// run it on a virtual clock; Check reads the wall clock. pop imports crdt and
// region, never replication or simulate: a PoP hands its deltas out and takes
// remote ones in through small interfaces that cmd wires up.
package pop
