package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"k3/internal/kernel"
	"k3/internal/openblas"
)

// best runs f reps times and returns the shortest duration.
func best(reps int, f func()) time.Duration {
	var b time.Duration
	for i := 0; i < reps; i++ {
		start := time.Now()
		f()
		if d := time.Since(start); i == 0 || d < b {
			b = d
		}
	}
	return b
}

// Kernels prints k3's GEMM and matrix-vector figures beside OpenBLAS's (when
// built with -tags openblas) and the machine limits, all measured in this
// run: `k3 bench kernels`.
func Kernels(w io.Writer) {
	p := kernel.NewPool(0)
	defer p.Close()
	threads := p.Size()
	openblas.SetThreads(threads)
	// Limits: a STREAM triad and read over arrays far past the cache, the
	// FMA peak.
	const big = 64 << 20
	a, b, c := make([]float32, big), make([]float32, big), make([]float32, big)
	for i := range b {
		b[i], c[i] = 1, 2
	}
	triad := p.Triad(a, b, c, 5)
	triadNT := p.TriadNT(a, b, c, 5)
	read := p.ReadBandwidth(b, 5)
	peak := p.PeakFLOPS()
	fmt.Fprintf(w, "kernel path: %s\n", kernel.Path())
	fmt.Fprintf(w, "machine limits measured now: STREAM triad %.1f GB/s (with non-temporal stores %.1f), read %.1f GB/s, 256-bit FMA peak %.0f GFLOP/s (%d threads)\n",
		triad/1e9, triadNT/1e9, read/1e9, peak/1e9, threads)
	// The exact products' shares are of the peak of the FMAs they issue:
	// the packed GEMM's 512-bit tile where the path has it (all three
	// shapes below take the packed GEMM then), else 256-bit ones.
	exactPeak, exactName := peak, "256-bit FMA peak"
	kmajPeak, kmajName := peak, exactName // the k-major tiles issue 512-bit FMAs where they run
	if wide := p.PeakWideFLOPS(); wide > 0 {
		kmajPeak, kmajName = wide, "512-bit FMA peak"
		use := "the k-major tiles only: this CPU runs it at under 1.5x the 256-bit rate, so the packed GEMM keeps 256-bit tiles"
		if kernel.WideFMA() {
			use = "the packed GEMM's tile and the k-major tiles"
			exactPeak, exactName = wide, "512-bit FMA peak"
		}
		fmt.Fprintf(w, "512-bit FMA peak %.0f GFLOP/s, %.2fx the 256-bit one (%s)\n", wide/1e9, wide/peak, use)
	}
	bf := p.PeakBF16DotFLOPS()
	if bf > 0 {
		use := "the go-fastbf16 backend's products use it"
		if !kernel.FastBF16Pays() {
			use = "under 1.25x the FLOP rate of the exact products' FMAs here, so the go-fastbf16 backend's products stay exact"
		}
		fmt.Fprintf(w, "bf16 dot-product peak (512-bit VDPBF16PS; only the opt-in fast product uses it, rounding x to bf16): %.0f GFLOP/s, %.2fx the 256-bit FMA peak (%s)\n", bf/1e9, bf/peak, use)
	}
	amx := p.PeakAMXFLOPS()
	if amx > 0 {
		use := "prefill's products (more than 32 rows) of a model's k-major weights run on it, repacked a slab at a time; K3_KERNEL=amx lays the weights out for it, so that every product does"
		switch {
		case kernel.AMXPreferred():
			use = "a model's bf16 weights take its layout in this process"
		case !kernel.AMXAvailable():
			use = "off in this process (K3_KERNEL caps the path)"
		}
		fmt.Fprintf(w, "AMX-BF16 tile peak (four independent TDPBF16PS, no memory traffic): %.0f GFLOP/s, %.1fx the 512-bit FMA peak; the exact AMX product runs three tile products per weight tile (x split into bf16 hi, mid, lo), so its ceiling is a third of it; the fast one rounds x to bf16 (one part; the go-fastbf16 backend's prefill products where the tiles run) (%s)\n", amx/1e9, amx/max(p.PeakWideFLOPS(), peak), use)
	}
	if openblas.Available {
		fmt.Fprintf(w, "OpenBLAS core: %s (set OPENBLAS_CORETYPE=SkylakeX if it says Prescott)\n", openblas.CoreName())
	} else {
		fmt.Fprintln(w, "OpenBLAS: not built in (go run -tags openblas ./cmd/k3 bench kernels, with libopenblas-dev)")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "GEMM C=A·Bᵀ\tk3 f32 GF/s\tk3 bf16-weight GF/s\t/ %s\tk-major bf16 GF/s\t/ %s\tAMX exact GF/s\t/ AMX peak\tk-major on AMX GF/s\t/ AMX peak\tAMX fast GF/s\t/ AMX peak\tfast bf16 (k pairs) GF/s\t/ bf16-dot peak\tOpenBLAS GF/s\tk3 f32 / OpenBLAS\tk3 f32 / peak\t\n", exactName, kmajName)
	for _, s := range [][3]int{{512, 2304, 768}, {256, 2048, 2048}, {1024, 1024, 1024}} {
		m, n, k := s[0], s[1], s[2]
		x, wt, y := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
		wb := make([]uint16, n*k)
		for i := range x {
			x[i] = float32(i%13) / 13
		}
		for i := range wt {
			wt[i] = float32(i%7) / 7
			wb[i] = 0x3f80 + uint16(i&63)
		}
		flops := 2 * float64(m*n*k)
		tk := best(5, func() { p.MatMul(y, x, wt, m, n, k) })
		tb := best(5, func() { p.MatMulBF16(y, x, wb, m, n, k) })
		// rate times run and formats its GFLOP/s and share of peak.
		rate := func(run func(), peak float64) (string, string) {
			t := best(5, run)
			return fmt.Sprintf("%.1f", flops/t.Seconds()/1e9), fmt.Sprintf("%.0f%%", 100*flops/t.Seconds()/peak)
		}
		// The layout the model's bf16 projections take where the 512-bit
		// kernels run (cpu.Backend.PrepareMatMul).
		kmaj, kmajShare, onAMX, onAMXShare := "-", "-", "-", "-"
		if kernel.KMajorFast() {
			wk := make([]uint16, kernel.KMajorLen(n, k))
			p.PackKMajor(wk, wb, n, k)
			kmaj, kmajShare = rate(func() { p.MatMulKMajor(y, x, wk, m, n, k) }, kmajPeak)
			if amx > 0 {
				// The default layout's prefill products (cpu.Backend.matmulHost).
				onAMX, onAMXShare = rate(func() { p.MatMulKMajorAMX(y, x, wk, m, n, k) }, amx)
			}
		}
		amxRate, amxShare, amxFast, amxFastShare := "-", "-", "-", "-"
		if amx > 0 {
			wp := make([]uint16, kernel.AMXLen(n, k))
			p.PackAMX(wp, wb, n, k)
			amxRate, amxShare = rate(func() { p.MatMulAMX(y, x, wp, m, n, k) }, amx)
			amxFast, amxFastShare = rate(func() { p.MatMulAMXFast(y, x, wp, m, n, k) }, amx)
		}
		// The go-fastbf16 backend's product: over pair-interleaved weights
		// where it lays them out (cpu.Backend.PrepareMatMul).
		fast, fastShare := "-", "-"
		switch {
		case kernel.KPairsFast():
			wk := make([]uint16, kernel.KPairLen(n, k))
			p.PackKPairs(wk, wb, n, k)
			fast, fastShare = rate(func() { p.MatMulKPairs(y, x, wk, m, n, k) }, bf)
		case kernel.FastBF16Available():
			fast, fastShare = rate(func() { p.MatMulBF16Fast(y, x, wb, m, n, k) }, bf)
		}
		ob, ratio := "-", "-"
		if openblas.Available {
			to := best(5, func() { openblas.Sgemm(y, x, wt, m, n, k) })
			settle()
			ob = fmt.Sprintf("%.1f", flops/to.Seconds()/1e9)
			ratio = fmt.Sprintf("%.0f%%", 100*to.Seconds()/tk.Seconds())
		}
		fmt.Fprintf(tw, "%dx%dx%d\t%.1f\t%.1f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t\n", m, n, k, flops/tk.Seconds()/1e9, flops/tb.Seconds()/1e9,
			100*flops/tb.Seconds()/exactPeak, kmaj, kmajShare, amxRate, amxShare, onAMX, onAMXShare, amxFast, amxFastShare, fast, fastShare, ob, ratio, 100*flops/tk.Seconds()/exactPeak)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "matrix-vector and few-row products (cold weights)\tGB/s\t/ triad\t/ NT triad\t/ read\tG weights/s\t")
	for _, s := range [][2]int{{4096, 4096}, {2048, 8192}} {
		rows, cols := s[0], s[1]
		copies := (768 << 20) / (4 * rows * cols)
		var wf [][]float32
		var wb [][]uint16
		for i := 0; i < copies; i++ {
			f := make([]float32, rows*cols)
			h := make([]uint16, rows*cols)
			for j := range f {
				f[j] = float32(j&63) / 64
				h[j] = 0x3f80 + uint16(j&63)
			}
			wf, wb = append(wf, f), append(wb, h)
		}
		x, y := make([]float32, cols), make([]float32, rows)
		// The host's bandwidth drifts from second to second, so each
		// measurement of the kernel sits among a triad, a non-temporal
		// triad and a read pass and is divided by them: the ratios are
		// medians of those neighbouring pairs, not of the kernel against a
		// probe taken at another moment.
		const reps, iters = 11, 12
		row := func(name string, bytesPer float64, after func(), f func(i int)) {
			bytes := float64(rows*cols) * bytesPer
			var rate, toTriad, toNT, toRead []float64
			for r := 0; r < reps; r++ {
				tr := p.Triad(a, b, c, 1)
				nt := p.TriadNT(a, b, c, 1)
				start := time.Now()
				for i := 0; i < iters; i++ {
					f(r*iters + i)
				}
				k := bytes * iters / time.Since(start).Seconds()
				after()
				rd := p.ReadBandwidth(b, 1)
				rate = append(rate, k)
				toTriad, toNT, toRead = append(toTriad, k/tr), append(toNT, k/nt), append(toRead, k/rd)
			}
			fmt.Fprintf(tw, "%s %dx%d\t%.1f\t%.0f%%\t%.0f%%\t%.0f%%\t%.1f\t\n", name, rows, cols, medianOf(rate)/1e9, 100*medianOf(toTriad),
				100*medianOf(toNT), 100*medianOf(toRead), medianOf(rate)/bytesPer/1e9)
		}
		row("k3 f32", 4, func() {}, func(i int) { p.MatMul(y, x, wf[i%copies], 1, rows, cols) })
		row("k3 bf16", 2, func() {}, func(i int) { p.MatMulBF16(y, x, wb[i%copies], 1, rows, cols) })
		if kernel.KMajorFast() {
			wk := make([][]uint16, len(wb))
			for i, h := range wb {
				wk[i] = make([]uint16, kernel.KMajorLen(rows, cols))
				p.PackKMajor(wk[i], h, rows, cols)
			}
			row("k3 bf16 k-major", 2, func() {}, func(i int) { p.MatMulKMajor(y, x, wk[i%copies], 1, rows, cols) })
			if rows == 2048 {
				// A decode batch's rows share each weight read, and each
				// brings 2 FLOP a weight: the share of the bandwidth a
				// product keeps as its arithmetic grows (at 8 rows, about
				// what the tiles compute warm) bounds batched decode.
				for _, m := range []int{2, 4, 8, 16} {
					xm, ym := make([]float32, m*cols), make([]float32, m*rows)
					row(fmt.Sprintf("k3 bf16 k-major, %d rows,", m), 2, func() {}, func(i int) { p.MatMulKMajor(ym, xm, wk[i%copies], m, rows, cols) })
				}
			}
		}
		if openblas.Available {
			row("OpenBLAS f32", 4, settle, func(i int) { openblas.Sgemv(y, wf[i%copies], x, rows, cols) })
		}
	}
	tw.Flush()
}

// settle waits for OpenBLAS's threads to stop spinning: they busy-wait
// for about 2^28 cycles after a call (its THREAD_TIMEOUT), and a kernel timed
// meanwhile shares its cores with them and loses about a third of its
// rate.
func settle() { time.Sleep(300 * time.Millisecond) }

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
