package yamltree

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSplitDocuments(t *testing.T) {
	docs := SplitDocuments([]byte("a: 1\n---\nb: 2\n--- # c\n  ---\nc: 3\n---"))
	require.Len(t, docs, 4)
	assert.Equal(t, "a: 1\n", string(docs[0]))
	assert.Equal(t, "b: 2\n", string(docs[1]))
	assert.Equal(t, "  ---\nc: 3\n", string(docs[2]), "only a line that is exactly --- splits")
	assert.True(t, Blank(docs[3]))
	assert.True(t, Blank([]byte("# only\n\n  # comments\n")))
	assert.False(t, Blank([]byte("# c\nx: 1\n")))
}

func TestPaths(t *testing.T) {
	root, err := Decode([]byte("spec:\n  routes:\n  - {name: 3, extra: x}\n"))
	require.NoError(t, err)
	spec, err := root.Object("spec")
	require.NoError(t, err)
	inner, err := spec["spec"].Object("routes")
	require.NoError(t, err)
	routes, err := inner["routes"].List()
	require.NoError(t, err)
	_, err = routes[0].Object("name")
	assert.EqualError(t, err, "spec.routes[0].extra: unknown field (known: name)")
	fields, err := routes[0].Object("name", "extra")
	require.NoError(t, err)
	_, err = fields["name"].Str()
	assert.EqualError(t, err, "spec.routes[0].name: must be a string, not a number")
	s, err := fields["name"].Scalar()
	require.NoError(t, err)
	assert.Equal(t, "3", s)
	_, err = root.List()
	assert.EqualError(t, err, "must be a list, not an object")
	_, err = Decode([]byte("a: [1\n"))
	assert.ErrorContains(t, err, "bad YAML")
}

func TestDecodeRejectsDuplicateKeys(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"top level", "kind: A\nkind: B\n", `kind: duplicate key "kind" (first on line 1, again on line 2)`},
		{"nested", "spec:\n  routes:\n  - name: a\n    condition: {method: GET, method: POST}\n", `spec.routes[0].condition.method: duplicate key "method" (first on line 4, again on line 4)`},
		{"in a list root", "- authority: a:80\n- authority: b:80\n  endpoints: []\n  authority: c:80\n", `[1].authority: duplicate key "authority" (first on line 2, again on line 4)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.doc))
			require.Error(t, err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
	n, err := Decode([]byte("a: {b: 1}\nc: {b: 2}\nlist: [{x: 1}, {x: 2}]\n"))
	require.NoError(t, err, "the same key in different objects is fine")
	assert.NotNil(t, n.Value)
}
