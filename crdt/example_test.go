package crdt_test

import (
	"fmt"

	"github.com/edgelimit/edgelimit/crdt"
)

// Two PoPs count the same key; each publishes absolute counts, and a receiver
// that sees a delta twice and out of order still gets the exact total.
func Example() {
	const window = 1_700_000_040_000_000_000
	fra, iad := crdt.NewLocal("fra1"), crdt.NewLocal("iad1")

	fra.Add("api_key=abc", window, 3)
	first := fra.Delta()
	fra.Add("api_key=abc", window, 2)
	second := fra.Delta()
	iad.Add("api_key=abc", window, 10)

	var seen crdt.Counters
	seen.Join(second...)
	seen.Join(iad.Delta()...)
	seen.Join(first...)  // late: lower than what is held, ignored
	seen.Join(second...) // duplicate: no change

	fmt.Println("global:", seen.Total("api_key=abc", window, nil))
	fmt.Println("europe:", seen.Total("api_key=abc", window, crdt.OneOf("fra1", "par1")))
	fmt.Println("fra1:", seen.Replica("api_key=abc", window, "fra1"))
	// Output:
	// global: 15
	// europe: 5
	// fra1: 5
}

func ExampleLocal_Restore() {
	const window = 1_700_000_040_000_000_000
	l := crdt.NewLocal("fra1")
	l.Add("k", window, 7)
	saved := l.Delta() // persisted before it is published

	// After a restart: restore first, then count on.
	l = crdt.NewLocal("fra1")
	l.Restore(saved...)
	l.Add("k", window, 1)
	fmt.Println(l.Delta())
	// Output:
	// [key="k" window=1700000040000000000 replica="fra1" count=8]
}

func ExampleBits() {
	var bits crdt.Bits
	bits.Join(
		crdt.Bit{Key: "api_key=abc", Scope: 2, Until: 100, Origin: "eu"},
		crdt.Bit{Key: "api_key=abc", Scope: 2, Until: 160, Origin: "us"},
		crdt.Bit{Key: "api_key=xyz", Scope: 2, Until: 90, Origin: "eu"},
	)
	fmt.Println(bits.Active(95))
	fmt.Println(bits.Expire(95), bits.Len())
	// Output:
	// [key="api_key=abc" scope=2 until=160 origin="us"]
	// 1 1
}
