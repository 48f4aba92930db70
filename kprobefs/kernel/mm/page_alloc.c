/* Page allocator: a free list per order (buddy-less), over the RAM the host hands to
 * mem_init().  Pages are reached through the direct map at PAGE_OFFSET. */
#include "kernel.h"

#define MAX_ORDER 11

struct free_page {
	struct free_page *next;
};

static struct free_page *free_area[MAX_ORDER];
static unsigned long mem_next, mem_end;
static DEFINE_SPINLOCK(zone_lock);
unsigned long totalram_pages, nr_free_pages_count;

static unsigned int get_order(size_t size)
{
	unsigned int order = 0;

	size = (size - 1) >> PAGE_SHIFT;
	while (size) {
		order++;
		size >>= 1;
	}
	return order;
}

void mem_init(unsigned long start_pa, unsigned long end_pa)
{
	mem_next = (unsigned long)__va(ALIGN(start_pa, PAGE_SIZE));
	mem_end = (unsigned long)__va(end_pa & ~(PAGE_SIZE - 1));
	totalram_pages = (mem_end - mem_next) >> PAGE_SHIFT;
	nr_free_pages_count = totalram_pages;
}

static void *__alloc_pages(unsigned int order)
{
	struct free_page *p;
	unsigned long size = PAGE_SIZE << order;

	spin_lock(&zone_lock);
	p = free_area[order];
	if (p) {
		free_area[order] = p->next;
	} else {
		unsigned long a = ALIGN(mem_next, size);

		if (a + size > mem_end) {
			spin_unlock(&zone_lock);
			return NULL;
		}
		mem_next = a + size;
		p = (struct free_page *)a;
	}
	nr_free_pages_count -= 1UL << order;
	spin_unlock(&zone_lock);
	return p;
}

void *alloc_pages_exact(size_t size, gfp_t gfp)
{
	unsigned int order = get_order(size);
	void *p;

	if (order >= MAX_ORDER)
		return NULL;
	p = __alloc_pages(order);
	if (p && (gfp & __GFP_ZERO))
		memset(p, 0, PAGE_SIZE << order);
	return p;
}

void free_pages_exact(void *addr, size_t size)
{
	unsigned int order = get_order(size);
	struct free_page *p = addr;

	if (!addr)
		return;
	spin_lock(&zone_lock);
	p->next = free_area[order];
	free_area[order] = p;
	nr_free_pages_count += 1UL << order;
	spin_unlock(&zone_lock);
}
