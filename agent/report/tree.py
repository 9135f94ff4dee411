"""The tree of hypotheses: each caption under the caption it was derived from, and how.

A caption's parent is where it was first proposed: the prompt whose failures were captioned (caption_failures), or
the caption that was perturbed or refined (perturb_caption). Captions the planner measured without either (its own
wording) hang under the class prompt. Proposals never measured, with nothing measured below them, are folded into
their parent's ``unmeasured`` list so the tree shows what was tested.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from sleuth.tools.investigation import normalise_caption


class Proposal(BaseModel):
    parent: str
    caption: str
    relation: str = Field(description="How the caption came from its parent, e.g. 'background: + in the snow'.")


class TreeNode(BaseModel):
    caption: str
    relation: str = ""
    tests: list[str] = Field(default_factory=list, description="measure_rate test ids of this caption.")
    finding_id: str | None = None
    children: list[TreeNode] = Field(default_factory=list)
    unmeasured: list[str] = Field(default_factory=list, description="'relation: caption' of proposals not measured.")

    def walk(self) -> Iterable[TreeNode]:
        yield self
        for c in self.children:
            yield from c.walk()


def build_tree(class_prompt: str | None, proposals: list[Proposal], tests: list[tuple[str, str]],
               findings: dict[str, str]) -> list[TreeNode]:
    """Roots of the hypothesis tree. ``tests`` are (caption, test id) in order; ``findings`` maps caption -> id."""
    nodes: dict[str, TreeNode] = {}
    roots: list[TreeNode] = []

    def add(caption: str, parent: TreeNode | None, relation: str) -> TreeNode:
        node = TreeNode(caption=caption, relation=relation)
        nodes[normalise_caption(caption)] = node
        (parent.children if parent is not None else roots).append(node)
        return node

    def planner_node(caption: str) -> TreeNode:
        found = nodes.get(normalise_caption(caption))
        if found is not None:
            return found
        root = nodes.get(normalise_caption(class_prompt)) if class_prompt else None
        return add(caption, root, "written by the planner" if root is not None else "")

    if class_prompt:
        add(class_prompt, None, "class prompt")
    for p in proposals:
        if normalise_caption(p.caption) in nodes:
            continue
        parent = planner_node(p.parent) if p.parent else None
        add(p.caption, parent, p.relation)
    for caption, test_id in tests:
        planner_node(caption).tests.append(test_id)
    for caption, fid in findings.items():
        node = nodes.get(normalise_caption(caption))
        if node is not None:
            node.finding_id = fid
    for root in roots:
        _prune(root)
    return roots


def _prune(node: TreeNode) -> bool:
    """Fold unmeasured leaves into their parent; True when ``node`` or a descendant was measured."""
    kept: list[TreeNode] = []
    for child in node.children:
        if _prune(child):
            kept.append(child)
        else:
            node.unmeasured.append(f"{child.relation}: {child.caption}" if child.relation else child.caption)
    node.children = kept
    return bool(node.tests) or bool(kept)
