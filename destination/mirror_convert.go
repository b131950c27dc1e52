package destination

import (
	"fmt"

	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/mirrorpb"
)

// mirrorsFromProto converts the request mirrors of a rule (inmesh's field
// 1002 of HttpRoute.Rule and GrpcRoute.Rule).
func mirrorsFromProto(ms []*mirrorpb.RequestMirror, path string) ([]policy.Mirror, error) {
	var out []policy.Mirror
	for i, m := range ms {
		mpath := fmt.Sprintf("%s[%d]", path, i)
		var pm policy.Mirror
		var err error
		if m.GetMetadata() == nil {
			return nil, errAt(mpath+".metadata", "required")
		}
		if pm.Meta, err = metadataFromProto(m.GetMetadata(), mpath+".metadata"); err != nil {
			return nil, err
		}
		switch k := m.GetKind().(type) {
		case *mirrorpb.RequestMirror_Dst:
			if k.Dst == "" {
				return nil, errAt(mpath+".dst", "empty")
			}
			pm.Authority = k.Dst
		case *mirrorpb.RequestMirror_Forward:
			ep, err := EndpointFromProto(k.Forward, nil, mpath+".forward")
			if err != nil {
				return nil, err
			}
			pm.Forward = &ep
		default:
			return nil, errAt(mpath, "one of dst and forward is required")
		}
		if pm.Ratio, err = ratioFromProto(m.GetRatio(), mpath+".ratio"); err != nil {
			return nil, err
		}
		out = append(out, pm)
	}
	return out, nil
}

// mirrorsToProto encodes the request mirrors of a rule.
func mirrorsToProto(ms []policy.Mirror) []*mirrorpb.RequestMirror {
	var out []*mirrorpb.RequestMirror
	for _, m := range ms {
		pm := &mirrorpb.RequestMirror{Metadata: metaToProto(m.Meta), Ratio: ratioToProto(m.Ratio)}
		if m.Forward != nil {
			pm.Kind = &mirrorpb.RequestMirror_Forward{Forward: EndpointToProto(*m.Forward)}
		} else {
			pm.Kind = &mirrorpb.RequestMirror_Dst{Dst: m.Authority}
		}
		out = append(out, pm)
	}
	return out
}
