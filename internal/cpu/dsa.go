package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"k3/compute"
	"k3/internal/kernel"
)

// indexerScratch holds one LightningIndexer call's plan and scores.
type indexerScratch struct {
	job   indexerJob
	pages [][]float32
}

// indexerJob is one wave of a LightningIndexer call: groups of query rows
// of one sequence each, every group scored against its keys a block of
// kernel.IndexerKeys keys per work item (the block transposed once for
// all the group's rows), then each row's top-k on its own.
type indexerJob struct {
	a         *compute.IndexerArgs
	q, k, w   []float32 // queries [T, H, D], keys [L, D] (nil when paged), head weights [T, H]
	idx       []int32   // the indices out
	counts    []int32   // nil without IndexerArgs.Counts
	hi, di    int
	pages     [][]float32 // a paged cache's pages (IndexerArgs.KPages) instead of k
	pshift    uint
	scoresOut []float32 // IndexerArgs.Scores, width floats a row, or nil
	width     int
	groups    []indexerGroup
	items     []indexerItem // the wave's score items, blocks zig-zag within a group
	rows      []indexerItem // the wave's query rows and their groups, for the top-k pass
	vis       []int32       // per query row of the call: its visible keys
	scores    []float32
	// qt holds the queries of each row alone in its group where
	// kernel.IndexerRows runs its tile, transposed (indexerGroup.qt);
	// such a row's blocks are scored from the keys as stored.
	qt []float32
	// bf16: the call scores in bf16 (NewFastBF16Indexer). Then qb holds
	// every row's queries rounded ([T][H][D], as q), and qp the queries of
	// each row scored by kernel.IndexerRowsBF16 as
	// kernel.TransposeQueryBF16 writes them (from indexerGroup.qt on).
	bf16 bool
	qp   []uint32
	qb   []uint16
	// The call's sequences (IndexerArgs.CuSeqlensQ and K, or cu's one
	// sequence), for plan.
	cuQ, cuK []int32
	cu       [2][2]int32
}

// indexerItem is a block of keys (score items) or a query row (top-k
// items) of group g.
type indexerItem struct{ g, i int32 }

// indexerGroup is query rows [r0, r1) of one sequence, whose keys start
// at k0 in IndexerArgs.K and of which they see keys at most; its rows'
// scores lie blocks·IndexerKeys floats apart from off in the job's scores.
type indexerGroup struct {
	r0, r1, k0, keys, blocks, off int
	// rowTiles: the group's one row is scored by kernel.IndexerRows (or
	// kernel.IndexerRowsBF16), its queries transposed in the job's qt (qp)
	// from qt on.
	rowTiles bool
	qt       int
}

// indexerWave bounds the scores one wave holds (floats).
var indexerWave = 1 << 20

// indexerKTs holds the score items' transposed key blocks.
var indexerKTs freeList[[]float32]

// indexerBF16 is a worker's scratch for the bf16 scores: a block of key
// pairs (kernel.KeyPairsBF16) and rounded keys.
type indexerBF16 struct {
	kt []uint32
	kb []uint16
}

var indexerBF16s freeList[indexerBF16]

// indexerScore runs score items [lo, hi): it transposes the item's block
// of keys, zero past the group's last visible key, and scores it for every
// row of the group that sees a key of it.
func indexerScore(args *kernel.Args, lo, hi int) { args.Job.(*indexerJob).score(lo, hi) }

// score runs the job's score items [lo, hi) (indexerScore).
func (j *indexerJob) score(lo, hi int) {
	const nk = kernel.IndexerKeys
	var kt []float32
	var bs *indexerBF16
	if j.bf16 {
		bs = indexerBF16s.get()
		defer func() { indexerBF16s.put(bs, 4*cap(bs.kt)+2*cap(bs.kb)) }()
		bs.kt = slices.Grow(bs.kt[:0], j.di/2*nk)[:j.di/2*nk]
		bs.kb = slices.Grow(bs.kb[:0], kernel.IndexerRowKeys*j.di)[:kernel.IndexerRowKeys*j.di]
	} else {
		ktp := indexerKTs.get()
		defer func() { indexerKTs.put(ktp, capBytes(*ktp)) }()
		*ktp = grow(*ktp, j.di*nk)
		kt = *ktp
	}
	items := j.items[lo:hi]
	for ii, it := range items {
		g := &j.groups[it.g]
		s0 := int(it.i) * nk
		n := min(nk, g.keys-s0)
		key := func(p int) []float32 { // key p of the group's sequence, and what follows it
			if j.pages != nil {
				return j.pages[p>>j.pshift][(p&(1<<j.pshift-1))*j.di:]
			}
			return j.k[(g.k0+p)*j.di:]
		}
		if g.rowTiles && n%kernel.IndexerRowKeys == 0 {
			r := g.r0
			if int(j.vis[r]) <= s0 {
				continue
			}
			off := g.off + s0
			w := j.w[r*j.hi : (r+1)*j.hi]
			for s := 0; s < n; s += kernel.IndexerRowKeys {
				var ahead []float32 // the next tile's keys: this block's, or the next item's
				if s+kernel.IndexerRowKeys < n {
					ahead = key(s0 + s + kernel.IndexerRowKeys)
				} else if ii+1 < len(items) && items[ii+1].g == it.g {
					ahead = key(int(items[ii+1].i) * nk)
				}
				if j.bf16 {
					kernel.IndexerRowsBF16(j.scores[off+s:], key(s0+s), j.di, j.qp[g.qt:g.qt+j.hi*j.di/2], w, j.hi, j.di, ahead, bs.kb)
					continue
				}
				kernel.IndexerRows(j.scores[off+s:], key(s0+s), j.di, j.qt[g.qt:g.qt+j.hi*j.di], w, j.hi, j.di, ahead)
			}
			continue
		}
		if j.bf16 {
			for s := range nk {
				if s < n {
					kernel.KeyPairsBF16(bs.kt, s, key(s0 + s)[:j.di], bs.kb)
					continue
				}
				for p := range j.di / 2 {
					bs.kt[p*nk+s] = 0
				}
			}
			for r := g.r0; r < g.r1; r++ {
				if int(j.vis[r]) <= s0 {
					continue
				}
				off := g.off + (r-g.r0)*g.blocks*nk + s0
				kernel.IndexerBlockBF16(j.scores[off:off+nk], bs.kt, j.qb[r*j.hi*j.di:(r+1)*j.hi*j.di], j.w[r*j.hi:(r+1)*j.hi], j.hi, j.di)
			}
			continue
		}
		s := 0
		if j.pages == nil || j.pshift >= 3 { // eight aligned keys share a page
			for ; s+8 <= n; s += 8 {
				kernel.TransposeKeys8(kt[s:], key(s0+s), j.di, j.di)
			}
		}
		for ; s < n; s++ {
			for d, v := range key(s0 + s)[:j.di] {
				kt[d*nk+s] = v
			}
		}
		for ; s < nk; s++ {
			for d := range j.di {
				kt[d*nk+s] = 0
			}
		}
		for r := g.r0; r < g.r1; r++ {
			if int(j.vis[r]) <= s0 {
				continue
			}
			off := g.off + (r-g.r0)*g.blocks*nk + s0
			kernel.IndexerBlock(j.scores[off:off+nk], kt, j.q[r*j.hi*j.di:(r+1)*j.hi*j.di], j.w[r*j.hi:(r+1)*j.hi], j.hi, j.di)
		}
	}
}

// indexerSelect runs the top-k of the wave's rows [lo, hi).
func indexerSelect(args *kernel.Args, lo, hi int) { args.Job.(*indexerJob).selectRows(lo, hi) }

// selectRows runs the job's top-k items [lo, hi) (indexerSelect).
func (j *indexerJob) selectRows(lo, hi int) {
	topK := j.a.TopK
	for _, it := range j.rows[lo:hi] {
		g, r := &j.groups[it.g], it.i
		vis := int(j.vis[r])
		off := g.off + (int(r)-g.r0)*g.blocks*kernel.IndexerKeys
		sr := j.scores[off : off+vis]
		out := j.idx[int(r)*topK : (int(r)+1)*topK]
		n := kernel.TopK(out, nil, sr, topK)
		for i := n; i < len(out); i++ {
			out[i] = -1
		}
		if j.counts != nil {
			j.counts[r] = int32(n)
		}
		if j.scoresOut != nil {
			dst := j.scoresOut[int(r)*j.width : (int(r)+1)*j.width]
			copy(dst, sr[:min(vis, j.width)])
			for i := min(vis, j.width); i < j.width; i++ {
				dst[i] = float32(math.Inf(-1))
			}
		}
	}
}

// pagesOf returns the host rows of pages (f32, [size, width] each) in
// dst, or an error naming what is wrong; size must be a power of two.
func pagesOf(dst [][]float32, pages []compute.Tensor, size, width int, what string) ([][]float32, uint, error) {
	if size <= 0 || size&(size-1) != 0 {
		return nil, 0, fmt.Errorf("cpu: %s: page size %d is not a power of two", what, size)
	}
	dst = dst[:0]
	for i, p := range pages {
		if p.DType != compute.F32 || p.Len() != size*width {
			return nil, 0, shapeErr("%s page %d is %v, want %d f32 rows of %d", what, i, p, size, width)
		}
		dst = append(dst, F32(p))
	}
	shift := uint(0)
	for 1<<shift < size {
		shift++
	}
	return dst, shift, nil
}

// poolPagesOf is pagesOf for pages that are rows of a pool (size·width
// floats a page) named by an I32 table.
func poolPagesOf(dst [][]float32, pool, table compute.Tensor, size, width int, what string) ([][]float32, uint, error) {
	if size <= 0 || size&(size-1) != 0 {
		return nil, 0, fmt.Errorf("cpu: %s: page size %d is not a power of two", what, size)
	}
	if width <= 0 {
		return nil, 0, shapeErr("%s rows of %d floats", what, width)
	}
	rows := F32(pool)
	if pool.DType != compute.F32 || rows == nil || len(rows)%(size*width) != 0 {
		return nil, 0, shapeErr("%s pool %v, want f32 pages of %d rows of %d", what, pool, size, width)
	}
	ids := I32(table)
	if table.DType != compute.I32 || table.Rank != 1 || ids == nil || len(ids) == 0 {
		return nil, 0, shapeErr("%s page table %v, want I32 [P]", what, table)
	}
	n := len(rows) / (size * width)
	dst = dst[:0]
	for i, p := range ids {
		if p < 0 || int(p) >= n {
			return nil, 0, shapeErr("%s page %d is page %d of a pool of %d", what, i, p, n)
		}
		dst = append(dst, rows[int(p)*size*width:int(p+1)*size*width])
	}
	shift := uint(0)
	for 1<<shift < size {
		shift++
	}
	return dst, shift, nil
}

// pageCount is the pages a paged operand has: its page list's, or its
// table's.
func pageCount(pages []compute.Tensor, table compute.Tensor) int {
	if pages != nil {
		return len(pages)
	}
	return table.Len()
}

// indexerScratches keeps a wave's scratch (indexerScratchBytes): a
// prefill chunk of a long prompt fills whole waves, and scores written
// into fresh memory each call took twice as long as into kept memory
// (docs/bench).
var indexerScratches = freeList[indexerScratch]{limit: indexerScratchBytes}

// indexerScratchBytes is the largest indexer scratch kept: a whole wave's
// scores (indexerWave floats) and as much again for its rows' queries
// and plan.
const indexerScratchBytes = 8 * (1 << 20)

// bytes is what the scratch's buffers hold.
func (sc *indexerScratch) bytes() int {
	j := &sc.job
	return capBytes(j.scores, j.qt) + 4*cap(j.qp) + 2*cap(j.qb) + 4*cap(j.vis) + 8*(cap(j.items)+cap(j.rows)) + 48*cap(j.groups) + 24*cap(sc.pages)
}

// LightningIndexer scores every visible key for every query row and keeps
// the top K. Head scores come from one matrix product per query row over
// the key cache (each key read once for all index heads), so the cost is
// linear in the context; selection keeps a K-entry heap.
func (b *Backend) LightningIndexer(a *compute.IndexerArgs) error {
	sc := indexerScratches.get()
	defer putIndexerScratch(sc)
	if err := sc.check(a); err != nil {
		return err
	}
	b.indexerPlan(&sc.job)
	b.indexerRun(&sc.job)
	return nil
}

// LightningIndexerBatch implements compute.IndexerBatcher: every call is
// checked first, then planned as LightningIndexer plans it alone (a call
// whose scores fill waves runs those on its own), and the calls' last
// waves run as one: one pass of score items over the workers, one of
// top-k rows. A row's scores and selection are computed as in its call
// alone.
func (b *Backend) LightningIndexerBatch(calls []*compute.IndexerArgs) error {
	bt := indexerBatches.get()
	defer bt.release()
	for i, a := range calls {
		sc := indexerScratches.get()
		bt.scs = append(bt.scs, sc)
		if err := sc.check(a); err != nil {
			return compute.CallErr("indexer", i, len(calls), err)
		}
	}
	bt.items, bt.rows = append(bt.items[:0], 0), append(bt.rows[:0], 0)
	for _, sc := range bt.scs {
		j := &sc.job
		b.indexerPlan(j)
		bt.jobs = append(bt.jobs, j)
		bt.items = append(bt.items, bt.items[len(bt.items)-1]+len(j.items))
		bt.rows = append(bt.rows, bt.rows[len(bt.rows)-1]+len(j.rows))
	}
	if n := len(bt.jobs); n > 0 {
		b.pool.Run(indexerBatchScore, kernel.Args{Job: bt}, bt.items[n], 1)
		b.pool.Run(indexerBatchSelect, kernel.Args{Job: bt}, bt.rows[n], 1)
	}
	return nil
}

// indexerBatch is one LightningIndexerBatch call's jobs: items[i] and
// rows[i] are the first score item and top-k row of jobs[i] in the lists
// the workers share.
type indexerBatch struct {
	scs         []*indexerScratch
	jobs        []*indexerJob
	items, rows []int
}

var indexerBatches freeList[indexerBatch]

func (bt *indexerBatch) release() {
	for i, sc := range bt.scs {
		putIndexerScratch(sc)
		bt.scs[i] = nil
	}
	clear(bt.jobs)
	bt.scs, bt.jobs = bt.scs[:0], bt.jobs[:0]
	indexerBatches.put(bt, 0)
}

// batchSpans calls f(i, lo', hi') for each call i of a batch whose share
// [first[i], first[i+1]) of the workers' list meets [lo, hi), lo' and hi'
// counted from the call's first.
func batchSpans(first []int, lo, hi int, f func(i, lo, hi int)) {
	for i := 0; i+1 < len(first); i++ {
		s, e := first[i], first[i+1]
		if e > lo && s < hi {
			f(i, max(lo, s)-s, min(hi, e)-s)
		}
	}
}

func indexerBatchScore(args *kernel.Args, lo, hi int) {
	bt := args.Job.(*indexerBatch)
	batchSpans(bt.items, lo, hi, func(i, lo, hi int) { bt.jobs[i].score(lo, hi) })
}

func indexerBatchSelect(args *kernel.Args, lo, hi int) {
	bt := args.Job.(*indexerBatch)
	batchSpans(bt.rows, lo, hi, func(i, lo, hi int) { bt.jobs[i].selectRows(lo, hi) })
}

// putIndexerScratch returns sc to its free list, without the call's
// tensors: it must not keep them alive.
func putIndexerScratch(sc *indexerScratch) {
	j := &sc.job
	j.a, j.q, j.k, j.w, j.idx, j.counts, j.pages, j.scoresOut, j.cuQ, j.cuK = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
	j.items, j.rows = j.items[:0], j.rows[:0]
	clear(sc.pages)
	indexerScratches.put(sc, sc.bytes())
}

// check checks a's operands and prepares the job in sc for plan.
func (sc *indexerScratch) check(a *compute.IndexerArgs) error {
	paged := a.KPages != nil || !a.PageTable.IsZero()
	if a.Q.Rank != 3 || (!paged && (a.K.Rank != 2 || a.Q.Dims[2] != a.K.Dims[1])) {
		return shapeErr("indexer q %v and keys %v, want [T, H, D] and [L, D]", a.Q, a.K)
	}
	t, hi, di := a.Q.Dims[0], a.Q.Dims[1], a.Q.Dims[2]
	var l int
	if paged {
		if np := pageCount(a.KPages, a.PageTable); a.KLen < 0 || a.KLen > np*a.PageSize || a.CuSeqlensK != nil {
			return fmt.Errorf("cpu: indexer: %d keys in %d pages of %d (one sequence)", a.KLen, np, a.PageSize)
		}
		l = a.KLen
	} else {
		l = a.K.Dims[0]
	}
	if err := compute.CheckShape("indexer weights", a.W, compute.F32, t, hi); err != nil {
		return err
	}
	qpos := I32(a.QPos)
	if a.QPos.DType != compute.I32 || len(qpos) != t {
		return fmt.Errorf("%w: indexer: query positions %v for %d rows", compute.ErrShape, a.QPos, t)
	}
	if a.TopK <= 0 {
		return fmt.Errorf("cpu: indexer: top-k %d must be positive", a.TopK)
	}
	j := &sc.job
	cuQ, cuK := a.CuSeqlensQ, a.CuSeqlensK
	if cuQ == nil {
		j.cu[0] = [2]int32{0, int32(t)}
		cuQ = j.cu[0][:]
	}
	if cuK == nil {
		j.cu[1] = [2]int32{0, int32(l)}
		cuK = j.cu[1][:]
	}
	ordered := true
	for s := 1; s < min(len(cuQ), len(cuK)); s++ {
		ordered = ordered && cuQ[s] >= cuQ[s-1] && cuK[s] >= cuK[s-1]
	}
	if !ordered || len(cuQ) != len(cuK) || cuQ[0] != 0 || cuK[0] != 0 || int(cuQ[len(cuQ)-1]) != t || int(cuK[len(cuK)-1]) != l {
		// Clones keep the slices from escaping on the success path.
		return shapeErr("indexer cu_seqlens q %v k %v for %d queries and %d keys", slices.Clone(cuQ), slices.Clone(cuK), t, l)
	}
	if err := compute.CheckShape("indexer indices", a.Indices, compute.I32, t, a.TopK); err != nil {
		return err
	}
	var counts []int32
	if !a.Counts.IsZero() {
		if err := compute.CheckShape("indexer counts", a.Counts, compute.I32, t); err != nil {
			return err
		}
		counts = I32(a.Counts)
	}
	var scores []float32
	width := 0
	if !a.Scores.IsZero() {
		if a.Scores.Rank != 2 || a.Scores.Dims[0] != t {
			return shapeErr("indexer scores %v for %d rows", a.Scores, t)
		}
		width = a.Scores.Dims[1]
		scores = F32(a.Scores)
	}
	q, k, w := F32(a.Q), F32(a.K), F32(a.W)
	if q == nil || (k == nil && !paged) {
		return shapeErr("indexer q %v and keys %v must be f32", a.Q, a.K)
	}
	*j = indexerJob{a: a, q: q, k: k, w: w, idx: I32(a.Indices), counts: counts, hi: hi, di: di,
		scoresOut: scores, width: width, groups: j.groups[:0], items: j.items[:0], rows: j.rows[:0],
		vis: j.vis[:0], scores: j.scores, qt: j.qt[:0], qp: j.qp[:0], qb: j.qb[:0], cuQ: cuQ, cuK: cuK, cu: j.cu}
	if paged {
		var err error
		if a.KPages != nil {
			sc.pages, j.pshift, err = pagesOf(sc.pages, a.KPages, a.PageSize, di, "indexer keys")
		} else {
			sc.pages, j.pshift, err = poolPagesOf(sc.pages, a.KPool, a.PageTable, a.PageSize, di, "indexer keys")
		}
		if err != nil {
			return err
		}
		j.pages = sc.pages
	}
	for s := 0; s+1 < len(cuQ); s++ {
		n := int(cuK[s+1] - cuK[s])
		for row := int(cuQ[s]); row < int(cuQ[s+1]); row++ {
			pos := int(qpos[row])
			if pos < 0 || pos >= n {
				return fmt.Errorf("cpu: indexer: query row %d at position %d, outside its sequence's %d cached keys", row, pos, n)
			}
			j.vis = append(j.vis, int32(min(pos+1, n)))
		}
	}
	return nil
}

// indexerRun runs the job's wave: its score items, then its rows' top k.
func (b *Backend) indexerRun(j *indexerJob) {
	b.pool.Run(indexerScore, kernel.Args{Job: j}, len(j.items), 1)
	// A causal wave's later rows select among more positions: one row at
	// a time evens the goroutines out.
	b.pool.RunEach(indexerSelect, kernel.Args{Job: j}, len(j.rows), 1)
	j.items, j.rows = j.items[:0], j.rows[:0]
}

// indexerPlan lays the job's rows out in groups of rows of one sequence,
// as many as a wave's scores hold (one row at least), and waves of
// groups; it runs every wave but the last, which it leaves in the job.
func (b *Backend) indexerPlan(j *indexerJob) {
	const nk = kernel.IndexerKeys
	q, hi, di, cuQ, cuK := j.q, j.hi, j.di, j.cuQ, j.cuK
	used := 0
	// Only where a decode row takes the bf16 rows tile: with fewer heads
	// (or dimensions not a multiple of 16) rounding and transposing a
	// block's keys for one row cost more than bf16 gains (8 heads of 64 at
	// 2,048 keys: 2.2x the exact call; docs/bench).
	j.bf16 = b.bf16Idx && kernel.IndexerRowsBF16Fast(hi, di) && b.fastDot()
	if j.bf16 {
		// Every row's queries rounded: a row scored by the rows tile takes
		// the block tile for its sequence's last, partial block.
		j.qb = slices.Grow(j.qb[:0], len(q))[:len(q)]
		kernel.RoundBF16DAZ(j.qb, q)
	}
	for s := 0; s+1 < len(cuQ); s++ {
		for r0 := int(cuQ[s]); r0 < int(cuQ[s+1]); {
			keys, r1 := int(j.vis[r0]), r0+1
			for r1 < int(cuQ[s+1]) {
				kr := max(keys, int(j.vis[r1]))
				if (r1-r0+1)*((kr+nk-1)/nk)*nk > indexerWave {
					break
				}
				keys, r1 = kr, r1+1
			}
			blocks := (keys + nk - 1) / nk
			size := (r1 - r0) * blocks * nk
			if used > 0 && used+size > indexerWave {
				b.indexerRun(j)
				used = 0
			}
			// Nothing is scored before run, so growing drops nothing.
			j.scores = grow(j.scores, used+size)
			g := int32(len(j.groups))
			// A row alone in its group (a decode step's) is scored from
			// the keys as stored, its queries transposed instead: where
			// rows share a group, one transposed block serves them all.
			// The tiles need 16 keys of one page.
			rowTiles := r1-r0 == 1 && (j.pages == nil || j.pshift >= 4)
			qt := len(j.qt)
			switch {
			case j.bf16 && rowTiles:
				qt = len(j.qp)
				j.qp = slices.Grow(j.qp, hi*di/2)[:qt+hi*di/2]
				kernel.TransposeQueryBF16(j.qp[qt:], q[r0*hi*di:], hi, di)
			case j.bf16:
				rowTiles = false
			case rowTiles && kernel.IndexerRowsFast(hi):
				j.qt = slices.Grow(j.qt, hi*di)[:qt+hi*di]
				kernel.TransposeQuery(j.qt[qt:], q[r0*hi*di:], hi, di)
			default:
				rowTiles = false
			}
			j.groups = append(j.groups, indexerGroup{r0: r0, r1: r1, k0: int(cuK[s]), keys: keys, blocks: blocks, off: used, rowTiles: rowTiles, qt: qt})
			for i := range blocks {
				b := i / 2 // 0, last, 1, last-1, ...: each half of the list holds early and late blocks
				if i%2 == 1 {
					b = blocks - 1 - i/2
				}
				j.items = append(j.items, indexerItem{g, int32(b)})
			}
			for r := r0; r < r1; r++ {
				j.rows = append(j.rows, indexerItem{g, int32(r)})
			}
			used += size
			r0 = r1
		}
	}
}

// denseCalls numbers the calls on the dense blocked path (attnJob.call),
// from 1.
var denseCalls atomic.Uint64

// maskKey names the mask maskRows built: the masked call, its rows
// [r0, r1), the kv head whose lists (0 where they are shared) and the
// positions a row spans.
type maskKey struct {
	call               uint64
	r0, r1, head, span int
}

// attnJob is one Attention call split over (row, kv head, part) items.
type attnJob struct {
	a                  *compute.AttnArgs
	q, qr, k, kr, v    []float32
	qpos               []int32 // a.QPos's elements
	idx                []int32
	idxHeads           int // kv heads the index lists cover (1: shared)
	t, hq, hkv, dk, dr int
	dv, kn, parts      int
	items              int  // t·hkv (row, kv head) items, each in parts pieces
	dense              bool // the dense blocked path (attnDense) instead
	// masked: an index-sparse call on the dense blocked path, each row's
	// logits outside its list masked (attnMaskedPays).
	masked bool
	// call numbers a call on the dense blocked path, so that a claim's
	// scratch and key cache know whose rows they hold (maskRows,
	// keyBlocks).
	call  uint64
	scale float32
	// partial results per item and query head: max, sum, then dv values.
	part []float32
	// A paged cache (AttnArgs.KPages): the pages' rows, nil otherwise;
	// vShared: the values are the keys.
	kp, vp, krp [][]float32
	pshift      uint
	vShared     bool
	// qt holds each item's query heads transposed where kernel.AttnLogits
	// runs its tile (groupBlock): [dk][hg] then [dr][hg] an item.
	qt []float32
	// qp, instead, where a sparse call's logits are bf16
	// (NewFastBF16Indexer, kernel.AttnLogitsBF16): each item's query heads
	// as pairs transposed, [dk/2][hg] then [dr/2][hg].
	qp []uint32
	// qLazy: each item's qt (qp) is written by the piece that runs the
	// item (a call whose items run whole, one piece each), not by the
	// caller before the pool run.
	qLazy bool
}

// transposeQuery writes item's query heads into its share of qt (or qp).
func (j *attnJob) transposeQuery(item int) {
	hg := j.hq / j.hkv
	q0 := item/j.hkv*j.hq + item%j.hkv*hg // the group's first query head
	if j.qp != nil {
		per := (j.dk + j.dr) / 2 * hg
		qp := j.qp[item*per : (item+1)*per]
		kernel.TransposeQueryBF16(qp, j.q[q0*j.dk:(q0+hg)*j.dk], hg, j.dk)
		if j.dr > 0 {
			kernel.TransposeQueryBF16(qp[j.dk/2*hg:], j.qr[q0*j.dr:(q0+hg)*j.dr], hg, j.dr)
		}
		return
	}
	per := (j.dk + j.dr) * hg
	qt := j.qt[item*per : (item+1)*per]
	kernel.TransposeQuery(qt, j.q[q0*j.dk:(q0+hg)*j.dk], hg, j.dk)
	if j.dr > 0 {
		kernel.TransposeQuery(qt[j.dk*hg:], j.qr[q0*j.dr:(q0+hg)*j.dr], hg, j.dr)
	}
}

// run returns the rows of positions [s, s+n) of a cache of width floats a
// position, contiguous or paged (the run within one page).
func (j *attnJob) run(flat []float32, pages [][]float32, s, n, width int) []float32 {
	if pages == nil {
		return flat[s*width : (s+n)*width]
	}
	o := s & (1<<j.pshift - 1)
	return pages[s>>j.pshift][o*width : (o+n)*width]
}

// keyRow, valRow and ropeRow return position s's key and value of kv head
// g and its rope key.
func (j *attnJob) keyRow(s, g int) []float32 {
	return j.run(j.k, j.kp, s, 1, j.hkv*j.dk)[g*j.dk : (g+1)*j.dk]
}

func (j *attnJob) valRow(s, g int) []float32 {
	return j.run(j.v, j.vp, s, 1, j.hkv*j.dv)[g*j.dv : (g+1)*j.dv]
}

func (j *attnJob) ropeRow(s int) []float32 { return j.run(j.kr, j.krp, s, 1, j.dr) }

// gatherAhead is how many rows ahead of its copy a gather of selected
// keys prefetches, in a call of at most gatherColdRows rows a sequence
// (a decode step, a verification pass). There each selected row comes
// from memory, wherever it lies in the cache, and a copy that waited for
// one row's misses after another left the memory idle (docs/bench: 4
// and 8 rows ahead against none, 16 no better than 8). A prefill chunk's
// rows share their selections, which the first reader brings into the
// caches, and the prefetches only cost it (2-8% of a 512-row sparse
// call).
const (
	gatherAhead    = 8
	gatherColdRows = 16
)

// prefetchRow prefetches position s's key of kv head g, its value
// unless the values are the keys, and its rope key if any.
func (j *attnJob) prefetchRow(s, g int) {
	kernel.Prefetch(j.keyRow(s, g))
	if !j.vShared {
		kernel.Prefetch(j.valRow(s, g))
	}
	if j.dr > 0 {
		kernel.Prefetch(j.ropeRow(s))
	}
}

// samePage reports whether positions s and e lie in one page (always,
// for a contiguous cache).
func (j *attnJob) samePage(s, e int) bool { return j.kp == nil || s>>j.pshift == e>>j.pshift }

type attnScratch struct {
	pos []int32
	z   []float32
	job attnJob
	// dense blocked path (attnDenseRange), and gathered blocks of the
	// grouped-head path of attnRange
	qb, qrb, kb, krb, vb, zb, e, rv, acc, m, l []float32
	// attnDenseRange: the keys of one kv head, gathered contiguous for the
	// positions [0, khLen) (khHead -1: none yet), and a vector of ones.
	kh, ones      []float32
	khHead, khLen int
	// A masked call's row block: added to each row's logits of positions
	// [0, last], 0 where its list holds the position, -Inf where not
	// (maskRows); attend: the positions one list holds (attnMaskedPays).
	mask        []float32
	maskKey     maskKey // what mask holds
	seen        []uint64
	macc        []float32 // MatAccumulate's scratch
	sums        []float32 // softmaxTogether: the heads' running sums
	kp, vp, krp [][]float32
	// groupBlock with kernel.AttnLogits: the tiles' logits, and a last
	// tile's keys padded to whole tiles; attend: the items' queries
	// transposed (attnJob.qt).
	zt, ktail, qt []float32
	// The bf16 logits (attnJob.qp): the items' queries as pairs (attend),
	// a block's keys rounded (groupBlock); and values: the heads' weights
	// rounded and the values paired by rows (valuesBF16).
	qp, vp2 []uint32
	kbb, eb []uint16
}

var attnScratches freeList[attnScratch]

// bytes is what the scratch's buffers hold.
func (sc *attnScratch) bytes() int {
	return 4*cap(sc.pos) + 8*cap(sc.seen) + 24*(cap(sc.kp)+cap(sc.vp)+cap(sc.krp)) + capBytes(sc.z, sc.qb, sc.qrb, sc.kb, sc.krb, sc.vb, sc.zb,
		sc.e, sc.rv, sc.acc, sc.m, sc.l, sc.kh, sc.mask, sc.ones, sc.sums, sc.macc, sc.zt, sc.ktail, sc.qt) + 4*(cap(sc.qp)+cap(sc.vp2)) + 2*(cap(sc.kbb)+cap(sc.eb))
}

// putAttnScratch returns sc to its free list, without the call's tensors.
func putAttnScratch(sc *attnScratch) {
	sc.job = attnJob{}
	clear(sc.kp)
	clear(sc.vp)
	clear(sc.krp)
	attnScratches.put(sc, sc.bytes())
}

// Attention runs dense causal or index-sparse attention. Work is split over
// query rows and kv heads, and for short batches also over the positions
// (flash-decoding), so that one decode step uses every worker while each
// cached row is read once for all the query heads that share it.
func (b *Backend) Attention(a *compute.AttnArgs) error {
	// The job lives in pooled scratch: a fresh one would escape to the
	// workers and allocate on every decode step.
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	if err := b.attnSetup(sc, a); err != nil {
		return err
	}
	return b.attnRun(sc)
}

// AttentionBatch implements compute.AttentionBatcher: every call is
// checked and planned as Attention plans it alone; a dense blocked call
// (prefill) then runs by itself, and the other calls' items go to the
// workers as one list, each call's parts merged after, so that every
// output has the bits of its call alone.
func (b *Backend) AttentionBatch(calls []*compute.AttnArgs) error {
	bt := attnBatches.get()
	defer bt.release()
	for i, a := range calls {
		sc := attnScratches.get()
		bt.scs = append(bt.scs, sc)
		if err := b.attnSetup(sc, a); err != nil {
			return compute.CallErr("attention", i, len(calls), err)
		}
	}
	bt.first = append(bt.first[:0], 0)
	for i, sc := range bt.scs {
		j := &sc.job
		if j.dense {
			if err := b.attnDense(j); err != nil {
				return compute.CallErr("attention", i, len(calls), err)
			}
			continue
		}
		bt.jobs = append(bt.jobs, j)
		bt.first = append(bt.first, bt.first[len(bt.first)-1]+j.items*j.parts)
	}
	if len(bt.jobs) == 0 {
		return nil
	}
	b.pool.Run(attnBatchRange, kernel.Args{Job: bt}, bt.first[len(bt.jobs)], 1)
	for _, j := range bt.jobs {
		j.merge()
	}
	return nil
}

// attnBatch is one AttentionBatch call's jobs: first[i] is the first item
// of jobs[i] in the list the workers share.
type attnBatch struct {
	scs   []*attnScratch
	jobs  []*attnJob
	first []int
}

var attnBatches freeList[attnBatch]

// release returns the batch's scratch and the batch to their pools.
func (bt *attnBatch) release() {
	for i, sc := range bt.scs {
		putAttnScratch(sc)
		bt.scs[i] = nil
	}
	clear(bt.jobs)
	bt.scs, bt.jobs = bt.scs[:0], bt.jobs[:0]
	attnBatches.put(bt, 0)
}

func attnBatchRange(args *kernel.Args, lo, hi int) {
	bt := args.Job.(*attnBatch)
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	batchSpans(bt.first, lo, hi, func(i, lo, hi int) { bt.jobs[i].pieces(sc, lo, hi) })
}

// attnRun runs the job attnSetup planned in sc.
func (b *Backend) attnRun(sc *attnScratch) error {
	j := &sc.job
	if j.dense {
		return b.attnDense(j)
	}
	b.pool.Run(attnRange, kernel.Args{Job: j}, j.items*j.parts, 1)
	j.merge()
	return nil
}

// attnSetup checks a's operands and plans its job in sc (attend).
func (b *Backend) attnSetup(sc *attnScratch, a *compute.AttnArgs) error {
	if a.KPages != nil || !a.PageTable.IsZero() {
		return b.pagedSetup(sc, a)
	}
	if a.Q.Rank != 3 || a.K.Rank != 3 || a.V.Rank != 3 {
		return shapeErr("attention q %v k %v v %v, want rank 3", a.Q, a.K, a.V)
	}
	sc.job = attnJob{a: a, t: a.Q.Dims[0], hq: a.Q.Dims[1], dk: a.Q.Dims[2], hkv: a.K.Dims[1], dv: a.V.Dims[2], scale: a.Scale}
	j := &sc.job
	l := a.K.Dims[0]
	if a.K.Dims[2] != j.dk || a.V.Dims[0] != l || a.V.Dims[1] != j.hkv || j.hkv == 0 || j.hq%j.hkv != 0 {
		return shapeErr("attention q %v k %v v %v", a.Q, a.K, a.V)
	}
	j.q, j.k, j.v = F32(a.Q), F32(a.K), F32(a.V)
	if j.q == nil || j.k == nil || j.v == nil {
		return shapeErr("attention operands must be f32")
	}
	j.vShared = j.dk == j.dv && &j.k[0] == &j.v[0]
	if !a.QRope.IsZero() {
		if a.QRope.Rank != 3 || a.QRope.Dims[0] != j.t || a.QRope.Dims[1] != j.hq || a.KRope.Rank != 2 || a.KRope.Dims[0] != l || a.KRope.Dims[1] != a.QRope.Dims[2] {
			return shapeErr("attention rope parts q %v k %v", a.QRope, a.KRope)
		}
		j.dr, j.qr, j.kr = a.QRope.Dims[2], F32(a.QRope), F32(a.KRope)
	}
	return b.attend(sc, l)
}

// pagedSetup checks a paged cache's operands and plans the same paths
// over its pages.
func (b *Backend) pagedSetup(sc *attnScratch, a *compute.AttnArgs) error {
	pooled := a.KPages == nil
	k0, v0 := a.KPool, a.VPool // the dimensions' source: [·, Hkv, D]
	if !pooled {
		if len(a.KPages) == 0 {
			return shapeErr("attention q %v with no key pages", a.Q)
		}
		k0 = a.KPages[0]
		if a.VPages != nil {
			if len(a.VPages) != len(a.KPages) {
				return shapeErr("attention value pages for %d key pages of %v", len(a.KPages), k0)
			}
			v0 = a.VPages[0]
		}
	}
	if a.Q.Rank != 3 || k0.Rank != 3 {
		return shapeErr("attention q %v, want rank 3, and rank-3 keys %v", a.Q, k0)
	}
	if a.PageSize%64 != 0 {
		return fmt.Errorf("cpu: attention: page size %d is not a multiple of 64", a.PageSize)
	}
	kd := k0.Dims
	dv := kd[2]
	hasV := !v0.IsZero()
	if hasV {
		if v0.Rank != 3 || v0.Dims[1] != kd[1] {
			return shapeErr("attention values %v for keys %v", v0, k0)
		}
		dv = v0.Dims[2]
	}
	sc.job = attnJob{a: a, t: a.Q.Dims[0], hq: a.Q.Dims[1], dk: a.Q.Dims[2], hkv: kd[1], dv: dv, scale: a.Scale}
	j := &sc.job
	if kd[2] != j.dk || j.hkv == 0 || j.hq%j.hkv != 0 {
		return shapeErr("attention q %v and keys %v", a.Q, k0)
	}
	pages := func(dst [][]float32, list []compute.Tensor, pool compute.Tensor, width int, what string) ([][]float32, uint, error) {
		if pooled {
			return poolPagesOf(dst, pool, a.PageTable, a.PageSize, width, what)
		}
		return pagesOf(dst, list, a.PageSize, width, what)
	}
	var err error
	if sc.kp, j.pshift, err = pages(sc.kp, a.KPages, a.KPool, j.hkv*j.dk, "attention keys"); err != nil {
		return err
	}
	j.kp, j.vp, j.vShared = sc.kp, sc.kp, true
	if hasV {
		if sc.vp, _, err = pages(sc.vp, a.VPages, a.VPool, j.hkv*j.dv, "attention values"); err != nil {
			return err
		}
		j.vp, j.vShared = sc.vp, false
	}
	if !a.QRope.IsZero() {
		if a.QRope.Rank != 3 || a.QRope.Dims[0] != j.t || a.QRope.Dims[1] != j.hq || (!pooled && len(a.KRopePages) != len(a.KPages)) {
			return shapeErr("attention rope parts q %v and %d rope pages", a.QRope, len(a.KRopePages))
		}
		j.dr, j.qr = a.QRope.Dims[2], F32(a.QRope)
		if sc.krp, _, err = pages(sc.krp, a.KRopePages, a.KRopePool, j.dr, "attention rope keys"); err != nil {
			return err
		}
		j.krp = sc.krp
	}
	if j.q = F32(a.Q); j.q == nil {
		return shapeErr("attention operands must be f32")
	}
	return b.attend(sc, len(j.kp)*a.PageSize)
}

// attend checks the rest of the operands against a cache of l positions
// and plans the job in sc: the dense blocked path (j.dense), or the
// items and parts attnRange takes.
func (b *Backend) attend(sc *attnScratch, l int) error {
	j := &sc.job
	a := j.a
	if a.KVLen < 0 || a.KVLen > l {
		return fmt.Errorf("cpu: attention: kv length %d outside the cache of %d", a.KVLen, l)
	}
	j.qpos = I32(a.QPos)
	if a.QPos.DType != compute.I32 || len(j.qpos) != j.t {
		return fmt.Errorf("%w: attention: query positions %v for %d rows", compute.ErrShape, a.QPos, j.t)
	}
	if err := compute.CheckShape("attention output", a.Out, compute.F32, j.t, j.hq, j.dv); err != nil {
		return err
	}
	if !a.LSE.IsZero() {
		if err := compute.CheckShape("attention lse", a.LSE, compute.F32, j.t, j.hq); err != nil {
			return err
		}
	}
	for row, p := range j.qpos {
		if p < 0 || int(p) >= a.KVLen {
			return fmt.Errorf("cpu: attention: query row %d at position %d beyond the cache length %d", row, p, a.KVLen)
		}
	}
	if !a.Indices.IsZero() {
		if a.Indices.Rank != 3 || a.Indices.Dims[0] != j.t || (a.Indices.Dims[1] != j.hkv && a.Indices.Dims[1] != 1) || a.Indices.DType != compute.I32 {
			return shapeErr("attention indices %v, want [%d, %d or 1, K]", a.Indices, j.t, j.hkv)
		}
		j.kn, j.idx, j.idxHeads = a.Indices.Dims[2], I32(a.Indices), a.Indices.Dims[1]
		// -1 pads and entries not yet written (>= KVLen) are skipped; an
		// index past the cache itself is a caller bug.
		for i, s := range j.idx {
			if int(s) >= l {
				return fmt.Errorf("cpu: attention: index %d (entry %d) outside the cache of %d rows", s, i, l)
			}
		}
	}
	if j.idx == nil && j.t >= attnDenseMin {
		j.dense = true
		j.call = denseCalls.Add(1)
		return nil
	}
	if j.idx != nil && j.t >= attnDenseMin && attnMaskedPays(sc, j) {
		j.dense, j.masked = true, true
		j.call = denseCalls.Add(1)
		return nil
	}
	// A row whose kv heads are fewer than the workers has its positions
	// split over all of them, and the parts merged in order. Passes of up
	// to compute.InvariantRows rows split every row as it is split alone,
	// so that a row's result does not depend on the rows beside it (one
	// call serves a verify pass or a prompt's chunk of one sequence).
	items := j.t * j.hkv
	j.items, j.parts = items, 1
	if items < b.pool.Size() || j.t <= compute.InvariantRows && j.hkv < b.pool.Size() {
		j.parts = b.pool.Size()
	}
	hg := j.hq / j.hkv
	need := items * j.parts * hg * (j.dv + 2)
	sc.z = grow(sc.z, need)
	j.part = sc.z
	j.qt, j.qp, j.qLazy = nil, nil, false
	switch {
	case b.bf16Attention(j, hg):
		// The bf16 logits of an index-sparse call (groupBlock).
		per := (j.dk + j.dr) / 2 * hg
		sc.qp = slices.Grow(sc.qp[:0], items*per)[:items*per]
		j.qp = sc.qp
	case hg >= attnGroupMin && kernel.AttnLogitsFast(hg):
		// Every head of a group in the lanes: the logits read each key
		// element once for all of them (groupBlock).
		per := (j.dk + j.dr) * hg
		sc.qt = grow(sc.qt, items*per)
		j.qt = sc.qt
	default:
		return nil
	}
	// Where each item runs whole in one piece (a prefill chunk's rows),
	// that piece transposes its queries, on the workers; where an item's
	// positions are split over the workers the caller does it first.
	j.qLazy = j.parts == 1
	if !j.qLazy {
		for item := range items {
			j.transposeQuery(item)
		}
	}
	return nil
}

// bf16Attention reports whether j's logits are bf16
// (kernel.AttnLogitsBF16): on NewFastBF16Indexer where its products take
// the bf16 dot product, for an index-sparse call (the dense ones stay
// float32, as Ascend's fused route leaves them) whose heads per kv head
// fill the tile's lanes and take the grouped path (groupBlock).
func (b *Backend) bf16Attention(j *attnJob, hg int) bool {
	return b.bf16Idx && j.idx != nil && j.dk%2 == 0 && j.dr%2 == 0 && hg >= attnGroupMin && kernel.AttnLogitsBF16Fast(hg) && b.fastDot()
}

// merge writes every (row, query head)'s output and lse from its parts,
// in order.
func (j *attnJob) merge() {
	a, items, hg := j.a, j.items, j.hq/j.hkv
	out := F32(a.Out)
	var lse []float32
	if !a.LSE.IsZero() {
		lse = F32(a.LSE)
	}
	for item := 0; item < items; item++ {
		row, g := item/j.hkv, item%j.hkv
		for hh := 0; hh < hg; hh++ {
			h := g*hg + hh
			o := out[(row*j.hq+h)*j.dv : (row*j.hq+h+1)*j.dv]
			m := float32(math.Inf(-1))
			for p := 0; p < j.parts; p++ {
				m = max(m, j.part[j.partOff(item, p, hh)])
			}
			clear(o)
			var sum float32
			if !math.IsInf(float64(m), -1) {
				for p := 0; p < j.parts; p++ {
					off := j.partOff(item, p, hh)
					pm, pl := j.part[off], j.part[off+1]
					if pl == 0 {
						continue
					}
					e := kernel.Exp(pm - m)
					sum += pl * e
					kernel.Axpy(o, e, j.part[off+2:off+2+j.dv])
				}
			}
			if sum > 0 {
				kernel.Scale(o, 1/sum)
			}
			if lse != nil {
				if sum > 0 {
					lse[row*j.hq+h] = m + float32(math.Log(float64(sum)))
				} else {
					lse[row*j.hq+h] = float32(math.Inf(-1))
				}
			}
		}
	}
}

func (j *attnJob) partOff(item, p, hh int) int {
	hg := j.hq / j.hkv
	return ((item*j.parts+p)*hg + hh) * (j.dv + 2)
}

// positions lists the cache rows that query row and kv head g attend to.
func (j *attnJob) positions(dst []int32, row, g int) []int32 {
	a := j.a
	limit := a.KVLen // exclusive
	qpos := int(j.qpos[row])
	if j.idx == nil {
		n := min(qpos+1, limit)
		for s := 0; s < n; s++ {
			dst = append(dst, int32(s))
		}
		return dst
	}
	if j.idxHeads == 1 {
		g = 0
	}
	for _, s := range j.idx[(row*j.idxHeads+g)*j.kn : (row*j.idxHeads+g+1)*j.kn] {
		if s < 0 || int(s) >= limit || (a.Causal && int(s) > qpos) {
			continue
		}
		dst = append(dst, s)
	}
	return dst
}

func attnRange(args *kernel.Args, lo, hi int) {
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	args.Job.(*attnJob).pieces(sc, lo, hi)
}

// pieces computes the job's (item, part) pieces [lo, hi) with scratch sc.
func (j *attnJob) pieces(sc *attnScratch, lo, hi int) {
	hg := j.hq / j.hkv
	const block = 64
	for it := lo; it < hi; it++ {
		item, p := it/j.parts, it%j.parts
		row, g := item/j.hkv, item%j.hkv
		if j.qLazy {
			j.transposeQuery(item)
		}
		sc.pos = j.positions(sc.pos[:0], row, g)
		n := len(sc.pos)
		per := (n + j.parts - 1) / j.parts
		pos := sc.pos[min(p*per, n):min((p+1)*per, n)]
		sc.z = grow(sc.z, hg*block)
		for hh := 0; hh < hg; hh++ {
			off := j.partOff(item, p, hh)
			j.part[off], j.part[off+1] = float32(math.Inf(-1)), 0
			clear(j.part[off+2 : off+2+j.dv])
		}
		for b0 := 0; b0 < len(pos); b0 += block {
			blk := pos[b0:min(b0+block, len(pos))]
			if hg >= attnGroupMin {
				j.groupBlock(sc, item, p, row, g, blk)
				continue
			}
			// Logits of every head of the group over the block; each key
			// row is loaded once for all of them.
			for bi, s := range blk {
				krow := j.keyRow(int(s), g)
				var kr []float32
				if j.qr != nil {
					kr = j.ropeRow(int(s))
				}
				for hh := 0; hh < hg; hh++ {
					h := g*hg + hh
					z := kernel.Dot(j.q[(row*j.hq+h)*j.dk:(row*j.hq+h+1)*j.dk], krow)
					if kr != nil {
						z += kernel.Dot(j.qr[(row*j.hq+h)*j.dr:(row*j.hq+h+1)*j.dr], kr)
					}
					sc.z[hh*block+bi] = z * j.scale
				}
			}
			for hh := 0; hh < hg; hh++ {
				off := j.partOff(item, p, hh)
				z := sc.z[hh*block : hh*block+len(blk)]
				m := j.part[off]
				for _, v := range z {
					m = max(m, v)
				}
				acc := j.part[off+2 : off+2+j.dv]
				if m > j.part[off] {
					if !math.IsInf(float64(j.part[off]), -1) {
						r := kernel.Exp(j.part[off] - m)
						kernel.Scale(acc, r)
						j.part[off+1] *= r
					}
					j.part[off] = m
				}
				for bi, s := range blk {
					e := kernel.Exp(z[bi] - m)
					j.part[off+1] += e
					kernel.Axpy(acc, e, j.valRow(int(s), g))
				}
			}
		}
	}
}

// denseRows is the query block of dense attention: rows that share a head
// share each gathered key and value block.
const denseRows = 8

// attnDenseMin is the pass length from which dense attention takes the
// blocked path: above compute.InvariantRows, since the blocked path's
// roundings differ from a row's alone. Tests lower it to denseRows to
// compare the blocked path with the row-by-row one on small passes.
var attnDenseMin = compute.InvariantRows + 1

// attnMaskedRatio is how many more positions the dense blocked path may
// score than an index-sparse call's lists hold and still run it faster,
// with the positions outside each row's list masked: the sparse path
// gathers each row's keys and values apart, the dense one reads a kv
// head's once for a block of rows (BenchmarkAttnMasked: docs/bench).
var attnMaskedRatio = 2.0

// attnMaskedPays reports whether an index-sparse pass of j runs on the
// dense blocked path with masks ("masked MHA", as DeepSeek-V3.2 runs
// short prefills): where the positions its rows see, up to their own,
// are at most attnMaskedRatio times the positions their lists hold, and
// no list holds a position twice (a mask counts it once, the sparse path
// twice).
func attnMaskedPays(sc *attnScratch, j *attnJob) bool {
	limit := j.a.KVLen
	seen := 0
	for _, p := range j.qpos {
		seen += min(int(p), limit-1) + 1
	}
	if float64(seen) > attnMaskedRatio*float64(j.t*j.kn) {
		return false // more than the ratio even with every entry listed
	}
	words := (limit + 63) / 64
	sc.seen = slices.Grow(sc.seen[:0], words)[:words]
	clear(sc.seen)
	listed := 0
	for row := range j.t {
		last := min(int(j.qpos[row]), limit-1)
		for g := range j.idxHeads {
			list := j.idx[(row*j.idxHeads+g)*j.kn : (row*j.idxHeads+g+1)*j.kn]
			dup := false
			for _, s := range list {
				if s < 0 || int(s) > last {
					continue
				}
				w, bit := s>>6, uint64(1)<<(s&63)
				dup = dup || sc.seen[w]&bit != 0
				sc.seen[w] |= bit
				listed++
			}
			for _, s := range list {
				if s >= 0 && int(s) <= last {
					sc.seen[s>>6] = 0
				}
			}
			if dup {
				return false
			}
		}
	}
	return float64(seen)*float64(j.idxHeads) <= attnMaskedRatio*float64(listed)
}

// attnDense runs dense causal attention (or masked, j.masked) for passes
// of at least denseRows query rows (prefill): on the grouped path
// (attnDenseGrouped, attnDenseGroupRange) or with work items (head, block
// of rows), so that the logits of a row block against a key block are one
// matrix product and each row's accumulator takes the block's values as
// one rank update.
func (b *Backend) attnDense(j *attnJob) error {
	if attnDenseGrouped(j.hq / j.hkv) {
		// A kv head's most expensive row blocks first (the last see the
		// most positions), one item a claim, so that the causal
		// triangle's cost splits evenly however few kv heads there are.
		b.pool.RunEach(attnDenseGroupRange, kernel.Args{Job: j}, j.hkv*j.groupBlocks(), 1)
		return nil
	}
	nb := (j.t + denseRows - 1) / denseRows
	// Head-major items: with as many heads as workers or more, each
	// worker's contiguous share is made of whole heads, so the causal
	// triangle's cost splits evenly.
	b.pool.Run(attnDenseRange, kernel.Args{Job: j}, j.hq*nb, 1)
	return nil
}

// attnDenseGrouped reports whether a dense pass with hg query heads a kv
// head takes the grouped path (attnDenseGroupRange): from attnGroupMin
// heads, and for any heads where MatAccumulate runs its 512-bit tiles
// (the 100M preset's MHA-form prefill, one head a kv head, ran 1.5x as
// fast as on the per-head path, BenchmarkAttnDense; on the 256-bit tile
// the two ran alike). Tests set it to run either path.
var attnDenseGrouped = func(hg int) bool { return hg >= attnGroupMin || kernel.MatAccumulateWide() }

// attnGroupQueries is about how many query rows (rows times the query
// heads of a kv head) one item of the grouped dense path holds: its
// logits and values are matrix products of that many rows.
const attnGroupQueries = 48

// groupBlocks is the number of row blocks of the grouped dense path.
func (j *attnJob) groupBlocks() int {
	rows := j.groupRows()
	return (j.t + rows - 1) / rows
}

// groupRows is the rows of one block of the grouped dense path.
func (j *attnJob) groupRows() int { return max(1, attnGroupQueries/(j.hq/j.hkv)) }

// negInfs is a run of -Inf that fillNegInf copies from.
var negInfs = func() (v [512]float32) {
	for i := range v {
		v[i] = float32(math.Inf(-1))
	}
	return v
}()

// fillNegInf sets every element of x to -Inf, a run at a time.
func fillNegInf(x []float32) {
	for len(x) > 0 {
		x = x[copy(x, negInfs[:]):]
	}
}

// maskRows sets sc.mask's rows [0, r1-r0), span positions each, to 0 at
// the positions of rows [r0, r1)'s lists for kv head g that the rows see
// and to -Inf elsewhere: added to the logits, it leaves the listed ones
// as they are. A mask the scratch already holds for the same call, rows,
// lists and span is kept (lists shared by the kv heads make one mask for
// all of them), though the grouped dense path's claims, kv head by kv
// head, seldom find one: its keys cost more than its masks.
func (j *attnJob) maskRows(sc *attnScratch, r0, r1, g, span int) {
	if j.idxHeads == 1 {
		g = 0
	}
	key := maskKey{call: j.call, r0: r0, r1: r1, head: g, span: span}
	if sc.maskKey == key {
		return
	}
	sc.maskKey = key
	sc.mask = grow(sc.mask, (r1-r0)*span)
	fillNegInf(sc.mask)
	for r := r0; r < r1; r++ {
		see := min(int(j.qpos[r]), j.a.KVLen-1)
		mask := sc.mask[(r-r0)*span : (r-r0+1)*span]
		for _, s := range j.idx[(r*j.idxHeads+g)*j.kn : (r*j.idxHeads+g+1)*j.kn] {
			if s >= 0 && int(s) <= see {
				mask[s] = 0
			}
		}
	}
}

// attnDenseGroupRange runs items [lo, hi) of the grouped dense path: for
// kv heads whose query heads share them (MLA's MQA form), an item is a
// kv head and a block of rows, and its queries (rows times heads) meet
// each block of 64 positions as matrix products: the logits against the
// block's keys transposed, then the values with every query row's
// accumulator rescaled to its new maximum as the tile loads it
// (kernel.MatAccumulateScaled). Each logit is one FMA chain over the
// latent then the rope dimensions. Items run kv head by kv head, each
// head's row blocks from the last to the first (attnDense), so that the
// keys all of a head's row blocks read stay cached from one to the next
// (keyBlocks), masked passes' too (each claim builds its row block's
// mask, maskRows).
func attnDenseGroupRange(args *kernel.Args, lo, hi int) {
	const block = 64
	j := args.Job.(*attnJob)
	a := j.a
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	hg, dk, dr, dv := j.hq/j.hkv, j.dk, j.dr, j.dv
	rows, nb := j.groupRows(), j.groupBlocks()
	nq := rows * hg
	sc.qb, sc.qrb = grow(sc.qb, nq*dk), grow(sc.qrb, nq*max(dr, 1))
	sc.zb, sc.kb, sc.krb = grow(sc.zb, nq*block), grow(sc.kb, dk*block), grow(sc.krb, max(dr, 1)*block)
	sc.acc, sc.m, sc.l, sc.rv = grow(sc.acc, nq*dv), grow(sc.m, nq), grow(sc.l, nq), grow(sc.rv, nq)
	sc.macc = grow(sc.macc, kernel.MatAccumulateScratch(max(dk, block)))
	sc.ktail = grow(sc.ktail, block*max(dk, dr))
	if len(sc.ones) != block {
		sc.ones = grow(sc.ones, block)
		for x := range sc.ones {
			sc.ones[x] = 1
		}
	}
	out := F32(a.Out)
	var lse []float32
	if !a.LSE.IsZero() {
		lse = F32(a.LSE)
	}
	kcache := keyCaches.get()
	defer func() { keyCaches.put(kcache, kcache.bytes()) }()
	for it := lo; it < hi; it++ {
		g, rb := it/nb, nb-1-it%nb // kv head by kv head: its keys stay cached
		r0, r1 := rb*rows, min((rb+1)*rows, j.t)
		n := (r1 - r0) * hg // query rows: row r's heads from (r-r0)·hg
		last := 0
		for r := r0; r < r1; r++ {
			q0 := r*j.hq + g*hg
			copy(sc.qb[(r-r0)*hg*dk:(r-r0+1)*hg*dk], j.q[q0*dk:(q0+hg)*dk])
			if dr > 0 {
				copy(sc.qrb[(r-r0)*hg*dr:(r-r0+1)*hg*dr], j.qr[q0*dr:(q0+hg)*dr])
			}
			last = max(last, min(int(j.qpos[r]), a.KVLen-1))
		}
		// The scale folded into the queries: the logits come out scaled.
		kernel.Scale(sc.qb[:n*dk], j.scale)
		if dr > 0 {
			kernel.Scale(sc.qrb[:n*dr], j.scale)
		}
		for q := range n {
			sc.m[q], sc.l[q] = float32(math.Inf(-1)), 0
		}
		acc := sc.acc[:n*dv]
		clear(acc)
		span := last + 1
		if j.masked {
			j.maskRows(sc, r0, r1, g, span)
		}
		kc := j.keyBlocks(kcache, sc, g, span)
		for s0 := 0; s0 <= last; s0 += block {
			nk := min(block, span-s0)
			kb, krb := sc.kb, sc.krb
			if kc != nil {
				kb, krb = kc.keys[s0*dk:(s0+block)*dk], kc.ropes[s0*dr:(s0+block)*dr]
			} else {
				j.transposeBlock(sc, kb, krb, g, s0, nk)
			}
			z := sc.zb[:n*block]
			clear(z)
			kernel.MatAccumulate(z, block, sc.qb[:n*dk], kb, block, n, block, dk, sc.macc)
			if dr > 0 {
				kernel.MatAccumulate(z, block, sc.qrb[:n*dr], krb, block, n, block, dr, sc.macc)
			}
			// Each query row's softmax step: positions past its row's own
			// (or outside its list) weigh 0.
			rr := sc.rv[:n]
			for q := range n {
				r := r0 + q/hg
				see := min(int(j.qpos[r]), a.KVLen-1) - s0 + 1 // positions of the block it sees
				zq := z[q*block : (q+1)*block]
				for x := max(see, 0); x < block; x++ {
					zq[x] = float32(math.Inf(-1))
				}
				if j.masked && see > 0 {
					w := min(see, nk)
					kernel.Add(zq[:w], zq[:w], sc.mask[(q/hg)*span+s0:(q/hg)*span+s0+w])
				}
				m := max(sc.m[q], kernel.Max(zq))
				rr[q] = 1
				if math.IsInf(float64(m), -1) {
					continue // none of the row's positions yet: all weigh 0
				}
				if !math.IsInf(float64(sc.m[q]), -1) && m > sc.m[q] {
					rr[q] = kernel.Exp(sc.m[q] - m)
				}
				sc.m[q] = m
				kernel.Axpy(zq, -m, sc.ones) // z - m, rounded once
			}
			kernel.ExpSlice(z)
			for q := range n {
				sc.l[q] = sc.l[q]*rr[q] + kernel.Dot(z[q*block:(q+1)*block], sc.ones)
			}
			if nk < block {
				// The weights' rows nk apart, as the values product reads
				// them (the values stop at the block's last position).
				for q := range n {
					copy(z[q*nk:(q+1)*nk], z[q*block:q*block+nk])
				}
			}
			vals := j.run(j.v, j.vp, s0, nk, j.hkv*dv)[g*dv:]
			kernel.MatAccumulateScaled(acc, dv, rr, z[:n*nk], vals, j.hkv*dv, n, dv, nk, sc.macc)
		}
		for q := range n {
			j.finish(out, lse, acc[q*dv:(q+1)*dv], r0+q/hg, g*hg+q%hg, sc.m[q], sc.l[q])
		}
	}
}

// keyCache holds one call's kv head's key blocks transposed as the
// grouped dense path's logits read them ([dk][64] a block) for positions
// [0, span), and the call's rope key blocks ([dr][64] a block, shared by
// every head) for [0, ropeSpan).
type keyCache struct {
	call, ropeCall uint64
	head           int
	span, ropeSpan int
	keys, ropes    []float32
}

func (c *keyCache) bytes() int { return capBytes(c.keys, c.ropes) }

// keyCaches keeps the key caches between claims: a kv head's row blocks
// (attnDenseGroupRange's consecutive items) read the same key blocks.
var keyCaches = freeList[keyCache]{limit: keyCacheBytes + 64<<10}

// keyCacheBytes bounds a key cache, as maxScratchBytes bounds the other
// scratch a free list keeps (a list holds a cache for each goroutine that
// ran the path at once): K3's MHA-form keys (128 + 64 floats a
// position) fit for 5,461 positions, past the masked passes' reach; a
// longer span's blocks are transposed one at a time into the claim's
// scratch instead.
const keyCacheBytes = 4 << 20

// keyBlocks returns c holding kv head g's key blocks (and the rope ones)
// transposed for positions [0, span), transposing those past the span it
// held for the same call and head, or nil where they would not fit.
// Columns past span in its last block may hold later keys, not zeros:
// the logits of positions past a row's own are -Inf either way.
func (j *attnJob) keyBlocks(c *keyCache, sc *attnScratch, g, span int) *keyCache {
	const block = 64
	dk, dr := j.dk, j.dr
	n := (span + block - 1) / block * block
	if 4*n*(dk+dr) > keyCacheBytes {
		return nil
	}
	if c.call != j.call || c.head != g || cap(c.keys) < n*dk {
		c.call, c.head, c.span = j.call, g, 0
	}
	if c.ropeCall != j.call || cap(c.ropes) < n*dr {
		c.ropeCall, c.ropeSpan = j.call, 0
	}
	// Sized to the need: doubling could pass the free list's limit.
	if cap(c.keys) < n*dk {
		c.keys = make([]float32, n*dk)
	}
	if cap(c.ropes) < n*dr {
		c.ropes = make([]float32, n*dr)
	}
	c.keys, c.ropes = c.keys[:cap(c.keys)], c.ropes[:cap(c.ropes)]
	// From the block the held span ends in (it may have been partial).
	for s0 := c.span / block * block; s0 < span && c.span < span; s0 += block {
		nk := min(block, span-s0)
		j.transposeBlock(sc, c.keys[s0*dk:(s0+block)*dk], nil, g, s0, nk)
	}
	c.span = max(c.span, span)
	for s0 := c.ropeSpan / block * block; dr > 0 && s0 < span && c.ropeSpan < span; s0 += block {
		nk := min(block, span-s0)
		j.transposeBlock(sc, nil, c.ropes[s0*dr:(s0+block)*dr], g, s0, nk)
	}
	c.ropeSpan = max(c.ropeSpan, span)
	return c
}

// transposeBlock writes the block of positions [s0, s0+nk) of kv head
// g's keys transposed into kb ([dk][64]) and the rope keys into krb
// ([dr][64]; either nil to skip it), zero past nk (the logits' tile takes
// whole 64s of columns); a block of 64 positions lies within one page.
func (j *attnJob) transposeBlock(sc *attnScratch, kb, krb []float32, g, s0, nk int) {
	const block = 64
	dk, dr := j.dk, j.dr
	if kb != nil {
		keys := j.run(j.k, j.kp, s0, nk, j.hkv*dk)
		if nk < block {
			kr := sc.ktail[:block*dk]
			for x := range nk {
				copy(kr[x*dk:(x+1)*dk], keys[x*j.hkv*dk+g*dk:])
			}
			clear(kr[nk*dk:])
			kernel.Transpose(kb, kr, block, dk)
		} else {
			kernel.TransposeFrom(kb, keys[g*dk:], block, dk, j.hkv*dk)
		}
	}
	if krb != nil && dr > 0 {
		ropes := j.run(j.kr, j.krp, s0, nk, dr)
		if nk < block {
			kr := sc.ktail[:block*dr]
			copy(kr, ropes)
			clear(kr[nk*dr:])
			ropes = kr
		}
		kernel.Transpose(krb, ropes, block, dr)
	}
}

func attnDenseRange(args *kernel.Args, lo, hi int) {
	const block = 64
	j := args.Job.(*attnJob)
	a := j.a
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	nb := (j.t + denseRows - 1) / denseRows
	hg := j.hq / j.hkv
	dk, dr, dv := j.dk, j.dr, j.dv
	sc.qb, sc.qrb = grow(sc.qb, denseRows*dk), grow(sc.qrb, denseRows*max(dr, 1))
	sc.zb, sc.e, sc.rv = grow(sc.zb, 2*denseRows*block), grow(sc.e, block), grow(sc.rv, dv)
	sc.acc, sc.m, sc.l = grow(sc.acc, denseRows*dv), grow(sc.m, denseRows), grow(sc.l, denseRows)
	if len(sc.ones) != dv {
		sc.ones = grow(sc.ones, dv)
		for x := range sc.ones {
			sc.ones[x] = 1
		}
	}
	// Items are head-major, so a worker's row blocks of one kv head come
	// in a row: its keys are gathered once, as far as the blocks reach,
	// instead of once per row block.
	sc.khHead, sc.khLen = -1, 0
	out := F32(a.Out)
	var lse []float32
	if !a.LSE.IsZero() {
		lse = F32(a.LSE)
	}
	for it := lo; it < hi; it++ {
		h, rb := it/nb, it%nb
		g := h / hg
		r0, r1 := rb*denseRows, min((rb+1)*denseRows, j.t)
		nr := r1 - r0
		last := 0 // the last position any row of the block sees
		for r := r0; r < r1; r++ {
			copy(sc.qb[(r-r0)*dk:(r-r0+1)*dk], j.q[(r*j.hq+h)*dk:])
			if dr > 0 {
				copy(sc.qrb[(r-r0)*dr:(r-r0+1)*dr], j.qr[(r*j.hq+h)*dr:])
			}
			last = max(last, min(int(j.qpos[r]), a.KVLen-1))
			sc.m[r-r0], sc.l[r-r0] = float32(math.Inf(-1)), 0
		}
		acc := sc.acc[:nr*dv]
		clear(acc)
		span := last + 1
		if j.masked {
			j.maskRows(sc, r0, r1, g, span)
		}
		if sc.khHead != g {
			sc.khHead, sc.khLen = g, 0
		}
		if need := last + 1; sc.khLen < need {
			sc.kh = growKeep(sc.kh, need*dk)
			for s := sc.khLen; s < need; s++ {
				copy(sc.kh[s*dk:(s+1)*dk], j.keyRow(s, g))
			}
			sc.khLen = need
		}
		for s0 := 0; s0 <= last; s0 += block {
			nk := min(block, last+1-s0)
			z := sc.zb[:nr*nk]
			kernel.MatMulSerial(z, sc.qb[:nr*dk], sc.kh[s0*dk:(s0+nk)*dk], nr, nk, dk)
			if dr > 0 {
				// The rope keys are one row per position, shared by
				// every head: already contiguous.
				zr := sc.zb[nr*nk : 2*nr*nk]
				kernel.MatMulSerial(zr, sc.qrb[:nr*dr], j.run(j.kr, j.krp, s0, nk, dr), nr, nk, dr)
				kernel.Add(z, z, zr)
			}
			kernel.Scale(z, j.scale)
			for r := r0; r < r1; r++ {
				i := r - r0
				n := min(nk, min(int(j.qpos[r]), a.KVLen-1)-s0+1) // causal: keys up to the row's position
				if n <= 0 {
					continue
				}
				zr := z[i*nk : i*nk+n]
				if j.masked {
					kernel.Add(zr, zr, sc.mask[i*span+s0:i*span+s0+n])
				}
				m := max(sc.m[i], kernel.Max(zr))
				if math.IsInf(float64(m), -1) {
					continue // masked: none of the row's positions yet
				}
				rr := float32(1)
				if !math.IsInf(float64(sc.m[i]), -1) && m > sc.m[i] {
					rr = kernel.Exp(sc.m[i] - m)
				}
				sc.m[i] = m
				e := sc.e[:n]
				for x, v := range zr {
					e[x] = v - m
				}
				kernel.ExpSlice(e)
				sum := sc.l[i] * rr
				for _, w := range e {
					sum += w
				}
				sc.l[i] = sum
				rv := sc.ones // the running maximum held: no rescaling (times 1 is exact)
				if rr != 1 {
					rv = sc.rv[:dv]
					for x := range rv {
						rv[x] = rr
					}
				}
				// A block of 64 positions lies within one page.
				kernel.RankUpdate(acc[i*dv:(i+1)*dv], rv, e, j.run(j.v, j.vp, s0, nk, j.hkv*dv)[g*dv:], j.hkv*dv)
			}
		}
		for r := r0; r < r1; r++ {
			i := r - r0
			j.finish(out, lse, acc[i*dv:(i+1)*dv], r, h, sc.m[i], sc.l[i])
		}
	}
}

// finish writes row r's head h output (acc over its softmax sum l) and
// lse (its maximum m plus log l) for the dense paths; a masked row whose
// list holds none of its positions (l 0) gets no output and an lse of
// -Inf, as the sparse path gives it.
func (j *attnJob) finish(out, lse, acc []float32, r, h int, m, l float32) {
	o := out[(r*j.hq+h)*j.dv : (r*j.hq+h+1)*j.dv]
	if l == 0 {
		clear(o)
		if lse != nil {
			lse[r*j.hq+h] = float32(math.Inf(-1))
		}
		return
	}
	kernel.MulScale(o, acc, nil, 1/l)
	if lse != nil {
		lse[r*j.hq+h] = m + float32(math.Log(float64(l)))
	}
}

// logits writes to z [hg][nk] the logits of item's query heads over the
// block's nk keys (kb, and krb's rope parts) with kernel.AttnLogits: each
// an FMA chain over the latent then the rope dimensions. A last tile of
// fewer keys runs on a copy padded with zeros.
func (j *attnJob) logits(sc *attnScratch, z []float32, item int, kb, krb []float32, nk int) {
	hg, dk, dr := j.hq/j.hkv, j.dk, j.dr
	const tk = kernel.AttnLogitsKeys
	per := hg * tk
	tiles := (nk + tk - 1) / tk
	sc.zt = grow(sc.zt, tiles*per)
	qt := j.qt[item*(dk+dr)*hg : (item+1)*(dk+dr)*hg]
	for tile := range tiles {
		s0 := tile * tk
		zt := sc.zt[tile*per : (tile+1)*per]
		k, kr := kb[s0*dk:], []float32(nil)
		if dr > 0 {
			kr = krb[s0*dr:]
		}
		if s0+tk > nk {
			sc.ktail = grow(sc.ktail, tk*(dk+dr))
			clear(sc.ktail)
			k = sc.ktail[:tk*dk]
			copy(k, kb[s0*dk:nk*dk])
			if dr > 0 {
				kr = sc.ktail[tk*dk:]
				copy(kr, krb[s0*dr:nk*dr])
			}
		}
		kernel.AttnLogits(zt, k, dk, qt, hg, dk, false)
		if dr > 0 {
			kernel.AttnLogits(zt, kr, dr, qt[dk*hg:], hg, dr, true)
		}
	}
	j.untile(sc, z, nk)
}

// logitsBF16 is logits in bf16 (attnJob.qp): the block's keys rounded
// once (kernel.RoundBF16DAZ, zero past nk to whole tiles), each logit one
// kernel.AttnLogitsBF16 chain over the latent's pairs then the rope's.
func (j *attnJob) logitsBF16(sc *attnScratch, z []float32, item int, kb, krb []float32, nk int) {
	hg, dk, dr := j.hq/j.hkv, j.dk, j.dr
	const tk = kernel.AttnLogitsKeys
	per := hg * tk
	tiles := (nk + tk - 1) / tk
	n := tiles * tk
	sc.zt = grow(sc.zt, tiles*per)
	sc.kbb = slices.Grow(sc.kbb[:0], n*(dk+dr))[:n*(dk+dr)]
	k, kr := sc.kbb[:n*dk], sc.kbb[n*dk:]
	kernel.RoundBF16DAZ(k[:nk*dk], kb[:nk*dk])
	clear(k[nk*dk:])
	if dr > 0 {
		kernel.RoundBF16DAZ(kr[:nk*dr], krb[:nk*dr])
		clear(kr[nk*dr:])
	}
	qp := j.qp[item*(dk+dr)/2*hg : (item+1)*(dk+dr)/2*hg]
	for tile := range tiles {
		s0 := tile * tk
		zt := sc.zt[tile*per : (tile+1)*per]
		kernel.AttnLogitsBF16(zt, k[s0*dk:], dk, qp, hg, dk, false)
		if dr > 0 {
			kernel.AttnLogitsBF16(zt, kr[s0*dr:], dr, qp[dk/2*hg:], hg, dr, true)
		}
	}
	j.untile(sc, z, nk)
}

// untile writes the tiles' logits, [chunk of 32 heads][key][head], to z's
// [head][key] (nk keys), read in order (kernel.AttnLogitsAt).
func (j *attnJob) untile(sc *attnScratch, z []float32, nk int) {
	hg := j.hq / j.hkv
	const tk = kernel.AttnLogitsKeys
	per := hg * tk
	tiles := (nk + tk - 1) / tk
	for tile := range tiles {
		zt := sc.zt[tile*per : (tile+1)*per]
		for c := 0; c < hg; c += 32 {
			for s := tile * tk; s < min(nk, (tile+1)*tk); s++ {
				row := zt[kernel.AttnLogitsAt(s%tk, c):][:32]
				for hh, v := range row {
					z[(c+hh)*nk+s] = v
				}
			}
		}
	}
}

// attnGroupMin is the number of query heads per kv head from which a key
// block is gathered once and scored for all of them with the matrix
// kernel (MLA in MQA form: every head shares the latent); tests raise it to
// compare with the key-by-key path.
var attnGroupMin = 4

// groupBlock runs one block of positions for the hg query heads that share
// kv head g in query row row: keys (and values) are gathered into
// contiguous blocks, the logits of all heads are one matrix product, and
// each head's accumulator takes the values as one rank update.
func (j *attnJob) groupBlock(sc *attnScratch, item, p, row, g int, blk []int32) {
	hg, dk, dr, dv, nk := j.hq/j.hkv, j.dk, j.dr, j.dv, len(blk)
	// Scratch is sized for a whole block, so that blocks growing with the
	// cache do not reallocate it step after step.
	const most = 64 // attnRange's block
	sc.kb, sc.zb = grow(sc.kb, most*dk), grow(sc.zb, 2*hg*most)
	sc.e, sc.rv = grow(sc.e, most), grow(sc.rv, dv)
	if len(sc.ones) != dv {
		sc.ones = grow(sc.ones, dv)
		for x := range sc.ones {
			sc.ones[x] = 1
		}
	}
	// MLA's MQA form reads the latent as both key and value.
	shared := j.vShared
	if !shared {
		sc.vb = grow(sc.vb, most*dv)
	}
	if dr > 0 {
		sc.krb = grow(sc.krb, most*dr)
	}
	kb, krb, vb := sc.kb, sc.krb, sc.vb
	contiguous := j.hkv == 1
	for bi, s := range blk {
		if s != blk[0]+int32(bi) {
			contiguous = false
			break
		}
	}
	if contiguous && j.samePage(int(blk[0]), int(blk[nk-1])) { // a run of one kv head's cache rows: read in place
		s0 := int(blk[0])
		kb, vb = j.run(j.k, j.kp, s0, nk, dk), j.run(j.v, j.vp, s0, nk, dv)
		if dr > 0 {
			krb = j.run(j.kr, j.krp, s0, nk, dr)
		}
	} else {
		ahead := 0
		if j.t <= gatherColdRows {
			ahead = min(gatherAhead, nk)
		}
		for bi := range ahead {
			j.prefetchRow(int(blk[bi]), g)
		}
		for bi, s := range blk {
			if ahead > 0 && bi+ahead < nk {
				j.prefetchRow(int(blk[bi+ahead]), g)
			}
			copy(kb[bi*dk:(bi+1)*dk], j.keyRow(int(s), g))
			if !shared {
				copy(vb[bi*dv:(bi+1)*dv], j.valRow(int(s), g))
			}
			if dr > 0 {
				copy(krb[bi*dr:(bi+1)*dr], j.ropeRow(int(s)))
			}
		}
		if shared {
			vb = kb
		}
	}
	q0 := row*j.hq + g*hg // the group's first query head
	z := sc.zb[:hg*nk]
	scaled := false
	switch {
	case j.qp != nil:
		j.logitsBF16(sc, z, item, kb, krb, nk)
	case j.qt != nil:
		j.logits(sc, z, item, kb, krb, nk)
	case hg < attnSwapHeads && nk >= 8:
		// Fewer heads than the eight-row tiles take: the keys' product
		// with the queries instead, transposed. The dot-form tiles give
		// every output the same FMA chains and sum whichever operand is
		// x, so the logits have the bits of the queries' product with
		// the keys (kernel.TestMatMulSwapBits).
		sc.zt = grow(sc.zt, 2*nk*hg)
		zt := sc.zt[:nk*hg]
		kernel.MatMulSerial(zt, kb[:nk*dk], j.q[q0*dk:(q0+hg)*dk], nk, hg, dk)
		if dr > 0 {
			zr := sc.zt[nk*hg : 2*nk*hg]
			kernel.MatMulSerial(zr, krb[:nk*dr], j.qr[q0*dr:(q0+hg)*dr], nk, hg, dr)
			kernel.Add(zt, zt, zr)
		}
		// Transposed and scaled in one pass (Scale's product, so the
		// same bits).
		for x := range nk {
			for hh, v := range zt[x*hg : (x+1)*hg] {
				z[hh*nk+x] = v * j.scale
			}
		}
		scaled = true
	default:
		kernel.MatMulSerial(z, j.q[q0*dk:(q0+hg)*dk], kb[:nk*dk], hg, nk, dk)
		if dr > 0 {
			zr := sc.zb[hg*nk : 2*hg*nk]
			kernel.MatMulSerial(zr, j.qr[q0*dr:(q0+hg)*dr], krb[:nk*dr], hg, nk, dr)
			kernel.Add(z, z, zr)
		}
	}
	if !scaled {
		kernel.Scale(z, j.scale)
	}
	// With many heads the values go in as one product for all of them
	// (each value loaded once per six heads), after each head's rescale;
	// the arithmetic is RankUpdate's either way.
	if hg >= attnValuesTogether {
		j.softmaxTogether(sc, z, item, p, nk, vb)
		return
	}
	for hh := 0; hh < hg; hh++ {
		off := j.partOff(item, p, hh)
		zh := z[hh*nk : (hh+1)*nk]
		m, r := j.newMax(off, zh)
		e := sc.e[:nk]
		for x, v := range zh {
			e[x] = v - m
		}
		kernel.ExpSlice(e)
		sum := j.part[off+1] * r
		for _, w := range e {
			sum += w
		}
		j.part[off+1] = sum
		rv := sc.ones // the running maximum held: no rescaling (times 1 is exact)
		if r != 1 {
			rv = sc.rv[:dv]
			for x := range rv {
				rv[x] = r
			}
		}
		kernel.RankUpdate(j.part[off+2:off+2+dv], rv, e, vb[:nk*dv], dv)
	}
}

// newMax takes the block's logits zh into the running maximum of the
// head whose part starts at off and returns the new maximum m and the
// factor r (1 where it held) by which the head's earlier sum and
// accumulator are rescaled.
func (j *attnJob) newMax(off int, zh []float32) (m, r float32) {
	m, r = max(j.part[off], kernel.Max(zh)), 1
	if !math.IsInf(float64(j.part[off]), -1) && m > j.part[off] {
		r = kernel.Exp(j.part[off] - m)
	}
	j.part[off] = m
	return m, r
}

// softmaxTogether is groupBlock's online softmax step and values product
// for hg heads of a kv head at once (hg >= attnValuesTogether), z holding
// the block's logits [hg][nk]: each head's new maximum, its weights
// exp(z - m) in place (one exponential over all of them), its running
// sum and accumulator rescaled, then the values as one product of the
// weights with vb. Each head's sum adds its weights in position order, as
// one chain, but the heads' chains run side by side: one head's 64
// dependent adds at a time left the core waiting on each.
func (j *attnJob) softmaxTogether(sc *attnScratch, z []float32, item, p, nk int, vb []float32) {
	hg, dv := j.hq/j.hkv, j.dv
	sc.sums = grow(sc.sums, hg)
	sums := sc.sums[:hg]
	for hh := range hg {
		off := j.partOff(item, p, hh)
		zh := z[hh*nk : (hh+1)*nk]
		m, r := j.newMax(off, zh)
		kernel.Axpy(zh, -m, blockOnes[:nk]) // z - m, rounded once
		sums[hh] = j.part[off+1] * r
		if r != 1 {
			kernel.Scale(j.part[off+2:off+2+dv], r)
		}
	}
	e := z[:hg*nk]
	kernel.ExpSlice(e)
	for x := range nk {
		for hh := range sums {
			sums[hh] += e[hh*nk+x]
		}
	}
	for hh, sum := range sums {
		j.part[j.partOff(item, p, hh)+1] = sum
	}
	off := j.partOff(item, p, 0)
	if j.qp != nil {
		j.valuesBF16(sc, j.part[off+2:], e, hg, nk, vb)
		return
	}
	sc.macc = grow(sc.macc, kernel.MatAccumulateScratch(64))
	kernel.MatAccumulate(j.part[off+2:], dv+2, e, vb, dv, hg, dv, nk, sc.macc)
}

// blockOnes is a block of ones for Axpy's subtraction of a constant.
var blockOnes = func() (v [64]float32) {
	for i := range v {
		v[i] = 1
	}
	return v
}()

// valuesBF16 adds the block's values to the hg heads' accumulators (acc,
// dv+2 floats apart) in bf16 (attnJob.qp): the weights e ([hg][nk]) and the
// values vb rounded, the values paired by rows (kernel.PairRowsBF16), one
// kernel.MatAccumulatePairs chain over the positions' pairs; an odd last
// position pairs with zeros.
func (j *attnJob) valuesBF16(sc *attnScratch, acc, e []float32, hg, nk int, vb []float32) {
	dv := j.dv
	kp := (nk + 1) / 2
	sc.eb = slices.Grow(sc.eb[:0], hg*2*kp)[:hg*2*kp]
	for h := range hg {
		row := sc.eb[h*2*kp : (h+1)*2*kp]
		kernel.RoundBF16DAZ(row[:nk], e[h*nk:(h+1)*nk])
		clear(row[nk:])
	}
	sc.vp2 = slices.Grow(sc.vp2[:0], kp*dv)[:kp*dv]
	kernel.PairRowsBF16(sc.vp2, vb, dv, nk, dv)
	kernel.MatAccumulatePairs(acc, dv+2, sc.eb, 2*kp, sc.vp2, hg, dv, kp)
}

// attnSwapHeads is the number of heads sharing a kv head below which
// groupBlock scores a block of eight keys or more as the keys' product
// with the queries: the eight-row tiles then take the keys, where the
// queries alone took the four-by-two tiles (the 100M preset's 6 heads:
// the products 1.7-1.9x as fast, the call 1.13-1.19x; BenchmarkAttnSparse,
// docs/bench). The bits are the same either way. A variable so that the
// benchmark can take both.
var attnSwapHeads = 8

// attnValuesTogether is the number of heads sharing a kv head from which
// the grouped path adds a block's values with one product for all of them
// (kernel.MatAccumulate) instead of one rank update per head.
const attnValuesTogether = 6

// growKeep is grow that keeps the contents when it reallocates.
func growKeep(b []float32, n int) []float32 {
	if cap(b) >= n {
		return b[:n]
	}
	nb := make([]float32, n, max(n, 2*cap(b)))
	copy(nb, b)
	return nb
}
