package escrow

import "time"

// Units the tests write instants and fractions in.
const (
	sec = int64(time.Second)
	ms  = int64(time.Millisecond)
	S   = DefaultScale
)
