"""sleuth tools: the investigation's tools and the backends they run on."""
