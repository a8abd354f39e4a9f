package escrow

import "time"

// Units the tests write instants and fractions in.
const (
	sec = int64(time.Second)
	ms  = int64(time.Millisecond)
	S   = DefaultScale
)

// lookAtAll makes the next Rebalance look at every key held, as it did
// before it kept the keys it looks at.
func (l *Ledger) lookAtAll() {
	for _, e := range l.entries {
		l.active[e.key] = e.spec
	}
}
