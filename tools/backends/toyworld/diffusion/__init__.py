"""toyworld-clip and toyworld-sd: a small CLIP and a small Stable Diffusion trained on the default world's renders.

They give the real-model paths (the diffusers generator, the null-text + prompt-to-prompt editor, CLIP embeddings
and checks) weights that mean something on a machine that can download none: ``--generator diffusers:toyworld-sd``,
``--editor sd-edit:toyworld-sd``, ``--embedder toyworld-clip``. ``scripts/train_toyworld_sd.py`` trains them from the
world config into the package's weights folder, in the standard formats (transformers ``CLIPModel``, diffusers
``StableDiffusionPipeline``), so the same code loads them as any checkpoint.
"""
