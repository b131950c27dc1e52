package manifest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Who may register a Service's endpoints: the service accounts of the
// Pods of its namespace that its selector matches (with the trust domain
// and control namespace of the options), then the identities of its
// inmesh.io/registration-identities annotation; a Service without a
// selector binds no Pod.
func TestRegistrationIdentities(t *testing.T) {
	r, err := Parse([]byte(`
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations: {inmesh.io/registration-identities: " admin.ops.serviceaccount.identity.linkerd.example.org , "}
spec: {selector: {app: books}, ports: [{port: 7000}]}
---
apiVersion: v1
kind: Service
metadata: {name: bare, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books, version: v1}}
spec: {serviceAccountName: books, containers: [{name: app}]}
---
apiVersion: v1
kind: Pod
metadata: {name: books-1, namespace: other, labels: {app: books}}
spec: {serviceAccountName: intruder, containers: [{name: app}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: default, labels: {app: web}}
spec: {serviceAccountName: web, containers: [{name: app}]}
`))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"app": "books"}, r.Service("default", "books").Selector)
	assert.Equal(t, []string{
		"books.default.serviceaccount.identity.mesh.example.org",
		"admin.ops.serviceaccount.identity.linkerd.example.org",
	}, r.RegistrationIdentities("default", "books", InboundOptions{TrustDomain: "example.org", ControlNamespace: "mesh"}))
	assert.Empty(t, r.RegistrationIdentities("default", "bare", InboundOptions{}))
	assert.Nil(t, r.RegistrationIdentities("default", "nothing", InboundOptions{}))
}

// A registration-identities item that is not an identity name refuses the
// document, naming the field.
func TestRegistrationIdentitiesInvalid(t *testing.T) {
	_, err := Parse([]byte(`
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations: {inmesh.io/registration-identities: "books.default.serviceaccount.identity.linkerd.cluster.local,not an identity"}
spec: {ports: [{port: 7000}]}
`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metadata.annotations.inmesh.io/registration-identities")
	assert.Contains(t, err.Error(), `"not an identity"`)
}
