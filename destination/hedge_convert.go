package destination

import (
	"math"

	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/proxyapi/hedgepb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// hedgeFromProto converts inmesh's hedging of a route (field 1001 of
// HttpRoute.Rule, GrpcRoute.Rule and the ServiceProfile Route); nil when
// the message carries none. path names the field in errors.
func hedgeFromProto(h *hedgepb.Hedge, path string) (*hedge.Policy, error) {
	if h == nil {
		return nil, nil
	}
	p := &hedge.Policy{MaxExtraLoad: h.GetMaxExtraLoad(), Idempotent: h.GetIdempotent()}
	switch d := h.GetDelay().(type) {
	case *hedgepb.Hedge_Fixed:
		v, err := durationFromProto(d.Fixed, path+".fixed")
		if err != nil {
			return nil, err
		}
		if v <= 0 {
			return nil, errAt(path+".fixed", "%v is not a positive delay", v)
		}
		p.Delay = v
	case *hedgepb.Hedge_Percentile:
		if math.IsNaN(d.Percentile) || d.Percentile <= 0 || d.Percentile >= 100 {
			return nil, errAt(path+".percentile", "%v is not between 0 and 100", d.Percentile)
		}
		p.Percentile = d.Percentile
	default:
		return nil, errAt(path+".delay", "required")
	}
	if err := p.Validate(); err != nil {
		return nil, errAt(path, "%v", err)
	}
	return p, nil
}

// hedgeToProto is the wire form of p; nil for none.
func hedgeToProto(p *hedge.Policy) *hedgepb.Hedge {
	if !p.Enabled() {
		return nil
	}
	h := &hedgepb.Hedge{MaxExtraLoad: p.MaxExtraLoad, Idempotent: p.Idempotent}
	if p.Percentile > 0 {
		h.Delay = &hedgepb.Hedge_Percentile{Percentile: p.Percentile}
	} else {
		h.Delay = &hedgepb.Hedge_Fixed{Fixed: durationpb.New(p.Delay)}
	}
	return h
}
