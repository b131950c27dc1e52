package controlplane

import (
	"testing"

	"github.com/inmesh/inmesh/proxyapi/identitypb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The Identity API's wire shape, field by field, as linkerd2-proxy-api
// v0.20.0's proto/identity.proto declares it.
func TestIdentityWireShape(t *testing.T) {
	type field struct {
		number   protoreflect.FieldNumber
		kind     protoreflect.Kind
		repeated bool
		message  protoreflect.FullName
	}
	for _, tc := range []struct {
		msg    protoreflect.MessageDescriptor
		name   protoreflect.FullName
		fields map[protoreflect.Name]field
	}{
		{(&identitypb.CertifyRequest{}).ProtoReflect().Descriptor(), "io.linkerd.proxy.identity.CertifyRequest", map[protoreflect.Name]field{
			"identity":                    {1, protoreflect.StringKind, false, ""},
			"token":                       {2, protoreflect.BytesKind, false, ""},
			"certificate_signing_request": {3, protoreflect.BytesKind, false, ""},
		}},
		{(&identitypb.CertifyResponse{}).ProtoReflect().Descriptor(), "io.linkerd.proxy.identity.CertifyResponse", map[protoreflect.Name]field{
			"leaf_certificate":          {1, protoreflect.BytesKind, false, ""},
			"intermediate_certificates": {2, protoreflect.BytesKind, true, ""},
			"valid_until":               {3, protoreflect.MessageKind, false, "google.protobuf.Timestamp"},
		}},
	} {
		assert.Equal(t, tc.name, tc.msg.FullName())
		require.Equal(t, len(tc.fields), tc.msg.Fields().Len(), "%s has other fields", tc.name)
		for name, want := range tc.fields {
			f := tc.msg.Fields().ByName(name)
			require.NotNil(t, f, "%s.%s", tc.name, name)
			assert.Equal(t, want.number, f.Number(), "%s.%s", tc.name, name)
			assert.Equal(t, want.kind, f.Kind(), "%s.%s", tc.name, name)
			assert.Equal(t, want.repeated, f.Cardinality() == protoreflect.Repeated, "%s.%s", tc.name, name)
			if want.message != "" {
				assert.Equal(t, want.message, f.Message().FullName(), "%s.%s", tc.name, name)
			}
		}
	}
	svc := identitypb.File_identity_proto.Services().ByName("Identity")
	require.NotNil(t, svc)
	assert.Equal(t, protoreflect.FullName("io.linkerd.proxy.identity.Identity"), svc.FullName())
	m := svc.Methods().ByName("Certify")
	require.NotNil(t, m)
	assert.False(t, m.IsStreamingClient() || m.IsStreamingServer(), "unary")
	assert.Equal(t, "/io.linkerd.proxy.identity.Identity/Certify", identitypb.Identity_Certify_FullMethodName)
}
