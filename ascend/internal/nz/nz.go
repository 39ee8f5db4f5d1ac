// Package nz lays matrices out in FRACTAL_NZ, the tiled format in which
// the Ascend cube unit reads a matmul's weight.
//
// A tensor [..., R, C] is cut into fractals of 16 rows by C0 columns, each
// stored row-major (the "Z" inside); the fractals are ordered down each
// column of fractals first (the "N" outside). The storage shape is
// [..., C1, R1, 16, C0] with R1 = ⌈R/16⌉ and C1 = ⌈C/C0⌉; the padding is
// zero. Element (r, c) of batch b lands at
//
//	(((b·C1 + c/C0)·R1 + r/16)·16 + r%16)·C0 + c%C0.
package nz

import (
	"errors"
	"fmt"
)

// R0 is the number of rows in a fractal.
const R0 = 16

// ErrShape reports dimensions or buffer lengths that do not fit.
var ErrShape = errors.New("nz: bad shape")

// C0 is the fractal width for elements of elemSize bytes: one 32-byte
// row of the cube unit (16 for fp16 and bf16, 32 for int8). Four-byte
// elements get 16, as torch_npu's FormatHelper counts them.
func C0(elemSize int) int {
	switch elemSize {
	case 1:
		return 32
	case 2, 4:
		return 16
	}
	return 0
}

// Layout is the NZ geometry of one [..., R, C] tensor.
type Layout struct {
	Batch  int // product of the leading dimensions
	R, C   int
	C0     int
	R1, C1 int
}

// NewLayout returns the layout of a tensor with the given dimensions (at
// least two) and fractal width c0.
func NewLayout(dims []int, c0 int) (Layout, error) {
	if len(dims) < 2 {
		return Layout{}, fmt.Errorf("%w: %d dimensions, need at least 2", ErrShape, len(dims))
	}
	if c0 <= 0 {
		return Layout{}, fmt.Errorf("%w: fractal width %d", ErrShape, c0)
	}
	l := Layout{Batch: 1, R: dims[len(dims)-2], C: dims[len(dims)-1], C0: c0}
	for i, d := range dims {
		if d <= 0 {
			return Layout{}, fmt.Errorf("%w: dimension %d is %d", ErrShape, i, d)
		}
		if i < len(dims)-2 {
			l.Batch *= d
		}
	}
	l.R1 = (l.R + R0 - 1) / R0
	l.C1 = (l.C + c0 - 1) / c0
	return l, nil
}

// StorageDims is the storage shape [..., C1, R1, 16, C0] for the leading
// dimensions lead.
func (l Layout) StorageDims(lead []int) []int {
	return append(append([]int(nil), lead...), l.C1, l.R1, R0, l.C0)
}

// Len is the number of stored elements, padding included.
func (l Layout) Len() int { return l.Batch * l.C1 * l.R1 * R0 * l.C0 }

// Offset is where element (r, c) of batch b is stored.
func (l Layout) Offset(b, r, c int) int {
	return (((b*l.C1+c/l.C0)*l.R1+r/R0)*R0+r%R0)*l.C0 + c%l.C0
}

// Pack writes the row-major src ([Batch, R, C]) into dst in NZ order,
// zeroing the padding. dst must hold Len elements.
func Pack[T any](l Layout, dst, src []T) error {
	if err := l.check(len(dst), len(src)); err != nil {
		return err
	}
	clear(dst)
	for b := 0; b < l.Batch; b++ {
		for r := 0; r < l.R; r++ {
			row := src[(b*l.R+r)*l.C:][:l.C]
			for c1 := 0; c1 < l.C1; c1++ {
				lo := c1 * l.C0
				n := min(l.C0, l.C-lo)
				copy(dst[l.Offset(b, r, lo):][:n], row[lo:lo+n])
			}
		}
	}
	return nil
}

// Unpack is Pack's inverse: it reads the NZ src into the row-major dst.
func Unpack[T any](l Layout, dst, src []T) error {
	if err := l.check(len(src), len(dst)); err != nil {
		return err
	}
	for b := 0; b < l.Batch; b++ {
		for r := 0; r < l.R; r++ {
			row := dst[(b*l.R+r)*l.C:][:l.C]
			for c1 := 0; c1 < l.C1; c1++ {
				lo := c1 * l.C0
				n := min(l.C0, l.C-lo)
				copy(row[lo:lo+n], src[l.Offset(b, r, lo):][:n])
			}
		}
	}
	return nil
}

func (l Layout) check(stored, plain int) error {
	if stored != l.Len() {
		return fmt.Errorf("%w: NZ buffer has %d elements, layout needs %d", ErrShape, stored, l.Len())
	}
	if plain != l.Batch*l.R*l.C {
		return fmt.Errorf("%w: row-major buffer has %d elements, [%d, %d, %d] needs %d", ErrShape, plain, l.Batch, l.R, l.C, l.Batch*l.R*l.C)
	}
	return nil
}
