package simulate

import "time"

// Graded is one decision for Grade: Hits hits of key Key (0 ≤ Key < the
// keys Grade is given) decided at At, admitted or not.
type Graded struct {
	Key      int
	At       time.Duration
	Hits     int64
	Admitted bool
}

// Grade grades decisions, in non-decreasing At, against the exact sliding
// log of a limit of limit hits per window, as the simulator's oracle grades
// a strategy's decisions: it says for each whether it was a false allow
// (admitted although the hits admitted in (At − window, At] plus its own
// exceed the limit) and whether it was a false deny (denied although they
// fit). Code that grades decisions made elsewhere — the lab's ledger — holds
// its rule against this one.
func Grade(window time.Duration, limit int64, keys int, ds []Graded) (falseAllow, falseDeny []bool) {
	o := newOracle(int64(window), limit, keys, -1, 1<<62, 1)
	falseAllow, falseDeny = make([]bool, len(ds)), make([]bool, len(ds))
	for i, d := range ds {
		fa, fd := o.falseAllow, o.falseDeny
		o.decide(d.Key, int64(d.At), d.Hits, d.Admitted)
		falseAllow[i], falseDeny[i] = o.falseAllow > fa, o.falseDeny > fd
	}
	return falseAllow, falseDeny
}
