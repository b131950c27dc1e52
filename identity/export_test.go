package identity_test

import (
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/proxyapi/identitypb"
)

func certifyRequest(l *identity.Local, token string) *identitypb.CertifyRequest {
	return &identitypb.CertifyRequest{Identity: l.Name(), Token: []byte(token), CertificateSigningRequest: l.CSR()}
}
