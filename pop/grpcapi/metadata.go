package grpcapi

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/edgelimit/edgelimit/pop"
)

// dynamicMetadata is the dynamic_metadata Envoy's ratelimit returns with
// RESPONSE_DYNAMIC_METADATA for request in decided as res:
//
//	domain       the request's domain
//	descriptors  one object per descriptor: entries ["key=value", ...], and
//	             its limit override (as text) and hits_addend when set
//	hitsAddend   the request's hits_addend, when not 0
//	metadata     the rule metadata (rules.Limit.Metadata) of the limits of the
//	             descriptors not over them, merged in descriptor order: a key
//	             already present keeps its value, two objects merge
//
// A descriptor that matched an unlimited limit contributes no metadata, nor
// one with a limit override (the peer's override is a limit of its own,
// without the rule's metadata), as in the peer. It allocates: it is built only when Config.DynamicMetadata is on.
func dynamicMetadata(in *rlsv3.RateLimitRequest, res *pop.Result) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(in.GetDomain())}
	ds := make([]*structpb.Value, 0, len(in.GetDescriptors()))
	for _, d := range in.GetDescriptors() {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.GetLimit() != nil {
			f["limit"] = structpb.NewStringValue(d.GetLimit().String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		ds = append(ds, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: ds})
	if h := in.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Unlimited || st.Code == pop.OverLimit || st.Limit == nil || len(st.Limit.Metadata) == 0 {
			continue
		}
		if i < len(in.GetDescriptors()) && in.GetDescriptors()[i].GetLimit() != nil {
			continue
		}
		// The rules' metadata holds JSON-like values only (rules.Limit),
		// which NewStruct always converts.
		if m, err := structpb.NewStruct(st.Limit.Metadata); err == nil {
			mergeMetadata(merged, m)
		}
	}
	if len(merged.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst: a key dst lacks is added, two objects
// under one key merge, and otherwise dst's value stays.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		old, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if a, b := old.GetStructValue(), v.GetStructValue(); a != nil && b != nil {
			mergeMetadata(a, b)
		}
	}
}
