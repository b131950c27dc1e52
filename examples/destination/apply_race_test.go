package main

import (
	"context"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// betweenReadAndWrite is an etcd KV that runs meanwhile once, right after
// its first Get: another writer acting between an apply's read and its
// transaction.
type betweenReadAndWrite struct {
	clientv3.KV
	once      sync.Once
	meanwhile func()
}

func (b *betweenReadAndWrite) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	r, err := b.KV.Get(ctx, key, opts...)
	b.once.Do(b.meanwhile)
	return r, err
}

// An apply leaves every document it was given in etcd, also one it found
// unchanged and so does not write, when another writer deletes that
// document between the apply's read and its transaction: the transaction
// fails, the apply reads again and creates the document.
func TestApplyKeepsAnUnchangedDocumentDeletedMeanwhile(t *testing.T) {
	m := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoint}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	ctx := context.Background()

	const authors = "apiVersion: v1\nkind: Service\nmetadata: {name: authors}\nspec: {ports: [{port: 7001}]}\n"
	const writers = "apiVersion: v1\nkind: Service\nmetadata: {name: writers}\nspec: {ports: [{port: 7003}]}\n"
	const writersEdited = "apiVersion: v1\nkind: Service\nmetadata: {name: writers}\nspec: {ports: [{port: 7004}]}\n"
	const authorsKey = "manifests/Service/default/authors"
	_, err = etcdstore.Apply(ctx, cli, "/mesh", etcdstore.Change{Manifests: []manifest.File{{Name: "a.yaml", Data: []byte(authors + "---\n" + writers)}}})
	require.NoError(t, err)

	racing := &clientv3.Client{KV: &betweenReadAndWrite{KV: cli.KV, meanwhile: func() {
		_, err := etcdstore.Delete(ctx, cli, "/mesh", []string{authorsKey})
		require.NoError(t, err)
	}}}
	rep, err := etcdstore.ApplyReport(ctx, racing, "/mesh", etcdstore.Change{Manifests: []manifest.File{{Name: "a.yaml", Data: []byte(authors + "---\n" + writersEdited)}}})
	require.NoError(t, err)

	resp, err := cli.Get(ctx, "/mesh/"+authorsKey)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the apply succeeded, but a document it was given is not in etcd (report %+v)", rep.Keys)
	assert.Equal(t, []etcdstore.KeyAction{
		{Name: authorsKey, Action: etcdstore.Created},
		{Name: "manifests/Service/default/writers", Action: etcdstore.Configured},
	}, rep.Keys, "the report is that of the state written")
}
