// Package lab runs edgelimit as real sites on one Linux machine: N regions ×
// M PoPs, every NATS server and every PoP a separate host in its own network
// namespace, started from the very files an operator deploys
// (deploy/nats/*.conf, deploy/systemd/pop.yaml), with the network between
// regions — latency, jitter, loss, cuts — read from an `edgelimit sim`
// scenario file, so the lab and the simulator run the same scenario and
// their results can be set side by side.
//
// The network (see Plan and network.go): each region is a bridge in a
// gateway namespace, its hosts hang off the bridge by veth pairs, and the
// gateway reaches the root namespace by two uplinks: "wan", which only the
// relays use, and "mgmt", which the lab uses to start, probe and scrape.
// Hosts of different regions have no IP route to each other; every
// connection between regions — the leaf links from each region's NATS
// servers to the hub region's — crosses a faultnet.Proxy in the root
// namespace that delays, jitters and loses as the scenario's link says (the
// kernel here has no netem, nor iptables). A region is cut by taking its
// wan link down, so the lab can still watch it.
//
// A scenario with direct: true (the lab's -direct) also gives every PoP the
// direct paths of `edgelimit pop --nats-direct`: for each server of every
// other region a relay of the PoP's own (Plan.Direct), listening on its
// region's wan side and dialing that server's client port from the other
// region's wan address, with the link between the two regions, so that each
// PoP's connection to a region is a stream of its own that loses and stalls
// on its own, as the simulator's direct path does; a cut of either region
// cuts it. The simulator run beside it then has direct: true too.
//
// The PoPs count as Layout says. StoreRedis is what deploy/ ships
// (deploy/compose.yaml, deploy/systemd/pop.yaml): every PoP its own
// redis-server, a host of its own in its region, and Layout.Servers servers
// under the PoP's name counting into it, each a host, all taking traffic.
// StoreMixed puts every other PoP on Redis and the rest on the embedded
// store, which has one server per PoP (two embedded stores under one name
// would be two replicas publishing as one). StoreEmbedded is the embedded
// store everywhere. Every server runs deploy/systemd/pop.yaml with only
// what differs per server on its command line; every NATS server runs
// deploy/nats's config with its leaf links' TLS on, from certificates the
// lab makes; every PoP connects with its own nkey from `edgelimit
// natsconf`, which also writes the servers' accounts.
//
// After the scenario's traffic the lab drives traffic shapes itself
// (Shapes: paced, a burst of 300 checks in 0.1 s over every server, one
// client alternating two PoPs of two regions, Config.AlternateGap apart), each on a key of its own of
// a global limit of 100 per hour with the consistency asked for (bounded
// only on embedded PoPs: a PoP on Redis refuses it, and so does NewPlan).
// Every decision is recorded with its send and answer times, and the
// ledger (Ledger) grades it against the exact sliding log of every PoP's
// admissions, per limit and fixed window: over-admission (admitted while
// the log was full), beyond the stated bound, and under-admission (denied
// while the log had room) — the simulator's oracle's rule
// (simulate.Grade), applied in every order that overlapping decisions may
// have been made in. Beside each shape, the simulator runs the same shape on
// the same network (ShapeScenario). The scenario's own traffic, which
// `edgelimit load` reports per second, is graded per window: its excess
// over the limit and what it admitted short of it (Window.Short).
//
// Run needs root (ip netns), and tears down everything it made — also on
// error and on interrupt — and, before it starts, whatever an earlier run
// left behind (everything named with Prefix).
//
// It may import anything; nothing imports it but its command and test.
package lab
