package ascend

import "k3/ascend/internal/acl"

// driver is what Backend needs of a device runtime: ACL through the cgo
// shim (driver_acl.go, -tags ascend), or the host driver (hostdriver.go),
// whose device memory is host memory and whose operators run in Go.
// The methods mirror ACL's and aclnn's: a stream queues work in order, an
// operator is prepared (phase 1) into an op that is launched (phase 2)
// on a stream with a workspace.
type driver interface {
	malloc(n int) (acl.DevPtr, error)
	free(p acl.DevPtr) error
	mallocHost(n int) (hostBuffer, error)
	newStream() (stream, error)
	newTensor(d acl.TensorDesc) (tensorDesc, error)
	newScalar(v float32) (scalar, error)
	newEvent() (event, error)

	matmul(name string, x, w, out tensorDesc, cubeMath int8) (prepared, error)
	unary(name string, x, out tensorDesc) (prepared, error)
	binary(name string, a, b, out tensorDesc) (prepared, error)
	add(a, b tensorDesc, alpha scalar, out tensorDesc) (prepared, error)
	softplus(x tensorDesc, beta, threshold scalar, out tensorDesc) (prepared, error)
	cast(x tensorDesc, dt acl.DataType, out tensorDesc) (prepared, error)
	fill(x tensorDesc, v scalar) (prepared, error)
	rmsNorm(x, gamma tensorDesc, eps float64, y, rstd tensorDesc) (prepared, error)
	layerNorm(x, w, b tensorDesc, eps float64, out, mean, rstd tensorDesc, d int) (prepared, error)
	muls(x tensorDesc, v scalar, out tensorDesc) (prepared, error)
	inplaceCopy(dst, src tensorDesc) (prepared, error)
	indexSelect(x tensorDesc, dim int, index, out tensorDesc) (prepared, error)
	indexAdd(x tensorDesc, dim int, index, source tensorDesc, alpha scalar, out tensorDesc) (prepared, error)
	// indexCopy is aclnnInplaceIndexCopy: x's slices at index along dim
	// become source's, in place.
	indexCopy(x tensorDesc, dim int, index, source tensorDesc) (prepared, error)
	// amax is aclnnAmax over the last dimension of a 2-D x, keeping it:
	// out [rows, 1].
	amax(x, out tensorDesc) (prepared, error)
	// topk is aclnnTopk: the k largest along dim, sorted, int64 indices.
	topk(x tensorDesc, k, dim int, values, indices tensorDesc) (prepared, error)
	// moeGating is aclnnMoeGatingTopK as k3 calls it; bias may be nil.
	moeGating(x, bias tensorDesc, k, kGroup, groups int, renorm bool, scale float64, y, idx tensorDesc) (prepared, error)
	// moeInitRouting is aclnnMoeInitRoutingV2 in its dropless form: the
	// (token, slot) pairs of idx [T, K] (int32 experts 0..experts-1)
	// sorted by expert, x's rows in that order into expandedX [T·K, H],
	// each pair's place into rowIdx [T·K] and the cumulative counts into
	// cumsum [experts] (int32).
	moeInitRouting(x, idx tensorDesc, experts int, expandedX, rowIdx, cumsum tensorDesc) (prepared, error)
	// groupedMatmul is aclnnGroupedMatmulV4 over one x [M, K], one stacked
	// w [G, K, N] and one out [M, N], grouped along M by the int64
	// cumulative groupList [G], whose last value must be M.
	groupedMatmul(x, w, groupList, out tensorDesc) (prepared, error)
	// rgdr is aclnnRecurrentGatedDeltaRule; g may be nil.
	rgdr(q, k, v, beta, state, seqLens, stateIdx, g, gk tensorDesc, scale float32, out tensorDesc) (prepared, error)
	// lightningIndexer is aclnnLightningIndexer as k3 calls it: queries
	// q [1, S1, N1, D] (layout BSND, one sequence), the key cache k
	// [blocks, blockSize, 1, D] (PA_BSND) read through blockTable [1, P],
	// weights [1, S1, N1], the key count actSeqK [1] (int32; the query
	// count is S1), sparseMode 3: query i sees keys 0..actSeqK−S1+i. Each
	// query's sparseCount best keys by Σ_h w_h·ReLU(q_h·k), best first,
	// go to indices [1, S1, 1, sparseCount] (int32), −1 past the keys it
	// sees.
	lightningIndexer(q, k, weights, actSeqK, blockTable tensorDesc, sparseCount int, indices tensorDesc) (prepared, error)
	// sparseFlashAttention is aclnnSparseFlashAttention in MLA-absorb mode
	// as k3 calls it: queries q [T, N, Dc] and qRope [T, N, Dr] (layout
	// TND, one sequence: actSeqQ [1] holds T), the latent cache kv
	// [blocks, blockSize, 1, Dc] as keys and values and kRope [blocks,
	// blockSize, 1, Dr] (PA_BSND) through blockTable [1, P], the key count
	// actSeqKV [1], indices [T, 1, K] (int32, sparseBlockSize 1; −1, an
	// index past the keys or past query t's causal limit actSeqKV−T+t
	// skipped), scale: out [T, N, Dc] and the softmax's max and sum
	// [1, T, N] (float32).
	sparseFlashAttention(q, kv, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope tensorDesc, scale float64, out, softmaxMax, softmaxSum tensorDesc) (prepared, error)

	// hasOperator reports whether the operator libraries have both
	// phases of the aclnn operator name.
	hasOperator(name string) bool

	close() error
}

type hostBuffer interface {
	Bytes() []byte
	Free() error
}

type stream interface {
	Sync() error
	upload(dst acl.DevPtr, src hostBuffer, off, n int) error
	download(dst hostBuffer, off int, src acl.DevPtr, n int) error
	Memset(dst acl.DevPtr, value byte, n int) error
	CopyDevice(dst, src acl.DevPtr, n int) error
	capture(fn func() error) (graph, error)
	// record queues e: it completes when the work queued before it has
	// run; wait makes the work queued after it wait for e's last record.
	record(e event) error
	wait(e event) error
	Destroy() error
}

type event interface{ Destroy() error }

type graph interface {
	replay(s stream) error
	Destroy() error
}

type tensorDesc interface{ Destroy() error }

type scalar interface{ Destroy() error }

type prepared interface {
	workspace() int
	launch(s stream, ws acl.DevPtr) error
	// repeat lets the executor be launched any number of times; destroy
	// then frees it.
	repeat() error
	destroy() error
}
