package node

// DefaultTopKeys is Config.TopKeys of `edgelimit pop` by default: the keys
// the sketch of the most limited keys holds. With k keys, a key denied more
// than 1/k of all denials is always among them.
const DefaultTopKeys = 100

// TopKeysMetric is how many of the most limited keys
// edgelimit_top_limited_keys exposes: the metric's bound on cardinality.
const TopKeysMetric = 10
